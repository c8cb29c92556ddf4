"""Files' states, as their readers finish them -> one clock, features and labels (DESIGN §4).

Readers finish files in any order. The files are stitched in the order data.paths lists them (as a
rule their time order) while later ones are still being read, and each block of rows no later file
can change gets its features at once, written to the features file; after the last file is read
what is left is that file's rows and the labels. Whether the listed order is the time order shows
only once every file is read (a file's first record time): where a file does not follow the one
listed before it (out of order, overlapping, another dataset) or the tick cannot be inferred from
the first rows, the work done ahead is dropped and the files are stitched again in time order by
`stitch.stitch`, whose checks name the files. The result never depends on the order of reading.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

import numpy as np

from perception.data.book import price_step, prices_seen
from perception.data.config import DataConfig
from perception.data.dbn_io import PRICE_SCALE
from perception.data.features import FEATURE_NAMES, compute_features, labels_from_mid2, mid2
from perception.data.file_clock import FilePart
from perception.data.stitch import Clock, Pieces, Stitcher, check_instruments, finished, follows, in_time_order
from perception.errors import DataError

FEATURE_BLOCK = 4_096  # snapshot rows per feature block: ~4 MB of temporaries, in cache
TICK_ROWS = 200_000  # rows the tick is inferred from (smallest_price_step's default)
_HEADER = 128  # bytes of the .npy header of any (T, F) float32 array (numpy pads it to 64)


def resolve_tick(cfg: DataConfig, inferred: int, names: str) -> int:
    """data.tick_size in price units (1e-9), or the inferred price step."""
    tick = int(round(cfg.tick_size / PRICE_SCALE)) if cfg.tick_size is not None else inferred
    if tick <= 0:
        raise DataError(f"{names}: cannot infer a tick size (one price level seen); set data.tick_size")
    return tick


def inferred_tick(clock: Clock | Stitcher) -> int:
    """The smallest price step of the first TICK_ROWS rows, read a block at a time."""
    n = min(TICK_ROWS, len(clock))
    seen = [np.zeros(0, np.int64)]
    for a in range(0, n, FEATURE_BLOCK):
        book = clock.books(a, min(a + FEATURE_BLOCK, n))
        seen.append(prices_seen(book["bid_px"], book["ask_px"]))
    return price_step(np.unique(np.concatenate(seen)))


class FeatureFile:
    """(T, F) float32 rows appended block by block: to a .npy file, whose header (it holds T) is
    written last, or kept in memory when there is no file."""

    def __init__(self, path: Optional[Path]):
        self.path, self.n = path, 0
        self._blocks: list[np.ndarray] = []
        self._file = open(path, "w+b") if path is not None else None
        self.restart()

    def restart(self) -> None:
        self.n, self._blocks = 0, []
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()
            self._file.write(bytes(_HEADER))

    def write(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, np.float32)
        if self._file is not None:
            self._file.write(rows.data)
        else:
            self._blocks.append(rows)
        self.n += len(rows)

    def close(self) -> np.ndarray:
        """The features: memory-mapped from the file, or in memory."""
        shape = (self.n, len(FEATURE_NAMES))
        if self._file is None:
            return np.concatenate(self._blocks) if self._blocks else np.zeros(shape, np.float32)
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header,
            {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": shape},
        )
        if len(header.getvalue()) != _HEADER:
            raise DataError(f"{self.path}: {shape} features need a {len(header.getvalue())}-byte header")
        self._file.seek(0)
        self._file.write(header.getvalue())
        self._file.close()
        assert self.path is not None  # the file is open only when there is a path
        return np.load(self.path, mmap_mode="r")

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()


class Assembly:
    """`add` each file's part as its reader finishes it (any order), then `finish`."""

    def __init__(self, cfg: DataConfig, features_file: Optional[Path], names: str):
        self.cfg, self.names = cfg, names
        self.parts: list[FilePart] = []  # in listed order, up to the first file not yet read
        self._waiting: dict[int, FilePart] = {}
        self._ahead: Optional[Stitcher] = Stitcher(cfg)  # None once the listed order fails
        self.tick = self._fixed_tick()
        if cfg.tick_size is not None and self.tick is None:
            self._ahead = None
        self.out = FeatureFile(features_file)
        self.m2 = Pieces(np.int64)  # (T,) twice the mid of the rows with features, for the labels

    def _fixed_tick(self) -> Optional[int]:
        """data.tick_size in price units; None when unset or unusable (resolve_tick names it)."""
        if self.cfg.tick_size is None:
            return None
        tick = int(round(self.cfg.tick_size / PRICE_SCALE))
        return tick if tick > 0 else None

    def add(self, part: FilePart) -> None:
        self._waiting[part.job.index] = part
        while len(self.parts) in self._waiting:
            p = self._waiting.pop(len(self.parts))
            if self._ahead is not None and self.parts and not follows(self.parts[-1], p):
                self._ahead = None
            self.parts.append(p)
            if self._ahead is not None:
                self._ahead.add(p)
        ahead = self._ahead
        if ahead is not None:
            if self.tick is None and len(ahead) >= TICK_ROWS:
                self.tick = inferred_tick(ahead)
                if self.tick <= 0:
                    self._ahead, self.tick = None, None
                    return
            if self.tick is not None:
                self._features(ahead, len(ahead) - len(ahead) % FEATURE_BLOCK, self.tick)

    def finish(self) -> tuple[Clock, np.ndarray, np.ndarray, np.ndarray]:
        """The clock, features (T, F), labels y and mask (T, H), checked as `stitch.stitch` does."""
        try:
            ordered = in_time_order(self.parts)
            check_instruments(self.cfg, ordered, self.names)
            if self._ahead is None or [p.job.index for p in ordered] != [p.job.index for p in self.parts]:
                self._ahead = Stitcher(self.cfg)  # the work done ahead is dropped: again, in time order
                self.tick = self._fixed_tick()
                for p in ordered:
                    self._ahead.add(p)
                self.out.restart()
                self.m2 = Pieces(np.int64)
            self._ahead.finish()
            clock = finished(self._ahead, self.names)
            if self.tick is None:
                inferred = inferred_tick(clock) if self.cfg.tick_size is None else 0
                self.tick = resolve_tick(self.cfg, inferred, self.names)
            self._features(clock, len(clock), self.tick)
        except BaseException:
            self.out.discard()
            raise
        features = self.out.close()
        y, mask = labels_from_mid2(self.m2.array(), clock.segment, self.cfg.horizons)
        return clock, features, y, mask

    def _features(self, clock: Clock | Stitcher, stop: int, tick: int) -> None:
        """Features of rows [done, stop), each block with the row before it (the mid's return)."""
        for a in range(self.out.n, stop, FEATURE_BLOCK):
            b = min(a + FEATURE_BLOCK, stop)
            lo = max(a - 1, 0)
            snaps = clock.snapshots(lo, b)
            self.out.write(compute_features(snaps, tick)[a - lo :])
            self.m2.extend(mid2(snaps)[a - lo :])
