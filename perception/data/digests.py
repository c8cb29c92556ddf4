"""Full-content digests of the input files, memoised by the (size, mtime_ns, inode) they were computed
for, the way DVC avoids re-hashing: a file is read whole only when that triple changed, so a training
pod finds the feature cache without reading its inputs, and an edited (new mtime) or replaced (new
inode) file always gets a new digest. The memo (`DIGESTS_FILE`, next to the cache entries) is read as
untrusted: an entry that is malformed, or for another triple, is recomputed. What it cannot see: bytes
changed in place with the size kept and the mtime set back by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Optional

from tqdm.auto import tqdm

from perception.atomic import atomic_write_text

DIGESTS_FILE = ".input_digests.json"
_BLOCK = 8 << 20
_BAR_FROM_BYTES = 256 << 20  # a smaller file hashes in well under a second: no bar


def stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def sha256_file(path: Path) -> str:
    """sha256 of every byte of `path`, with a bar (bytes/s, ETA) for a large file."""
    size = os.stat(path).st_size
    h = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            desc=f"sha256 {path.name}",
            disable=size < _BAR_FROM_BYTES,
            file=sys.stderr,
        ) as bar,
    ):
        while block := f.read(_BLOCK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


class DigestMemo:
    """`digest(path)` from the memo when the file's triple is the one recorded, else computed and
    recorded; `save()` writes what was computed, merged with what other processes wrote meanwhile."""

    def __init__(self, file: Optional[Path]):
        self.file = file
        self.entries = _read(file) if file is not None else {}
        self.computed: dict[str, dict] = {}

    def digest(self, path: Path) -> str:
        key = str(Path(path).resolve())
        now = stamp(path)
        entry = self.entries.get(key)
        if entry is not None and entry["stamp"] == now:
            return entry["sha256"]
        digest = sha256_file(path)
        if stamp(path) == now:  # changed while being read: not memoised, the next reader hashes again
            self.entries[key] = self.computed[key] = {"stamp": now, "sha256": digest}
        return digest

    def save(self) -> None:
        if self.file is None or not self.computed:
            return
        try:
            merged = {**_read(self.file), **self.computed}  # last writer wins per file: at worst a re-hash
            atomic_write_text(self.file, json.dumps(merged, indent=1, sort_keys=True))
        except OSError as exc:  # a read-only cache volume: the digests stay correct, only unmemoised
            print(f"[perception] could not record input digests in {self.file}: {exc}", file=sys.stderr)
        self.computed = {}


def _read(file: Path) -> dict[str, dict]:
    """The memo's well-formed entries; anything else in it is ignored (its files are hashed again)."""
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(v, dict) and _well_formed(v)}


def _well_formed(entry: dict) -> bool:
    s, d = entry.get("stamp"), entry.get("sha256")
    return (
        isinstance(s, list)
        and len(s) == 3
        and all(isinstance(x, int) for x in s)
        and isinstance(d, str)
        and len(d) == 64
        and all(c in "0123456789abcdef" for c in d)
    )
