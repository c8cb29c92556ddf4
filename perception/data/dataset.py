"""`load_dataset`: books -> snapshots -> raw features and labels, through the feature cache.

The cache (`PERCEPTION_HOME/cache/<data_hash>/`) holds raw features and labels for all folds;
z-scoring happens later with the training fold's statistics. A build writes into a temp
directory and renames it into place, so concurrent builders leave one complete cache.
DBN files are streamed (ingest.py); `build_in_memory` keeps the whole-array path as the oracle
the streaming path is tested against.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from tqdm.auto import tqdm

from perception.enums import enum_value
from perception.data.book import Snapshots, smallest_price_step, snapshots_from_records
from perception.data.checks import as_data_config, check_data_config, resolve_paths
from perception.data.config import DataConfig, DataSource, SyntheticWorld
from perception.data.digests import DIGESTS_FILE, DigestMemo
from perception.data.dbn_io import read_mbp10
from perception.data.features import FEATURE_NAMES, compute_features, compute_labels
from perception.data import ingest
from perception.data.assemble import inferred_tick, resolve_tick
from perception.data.stitch import Clock
from perception.errors import ConfigError, DataError, PerceptionError
from perception.locks import Lock, LockHeld
from perception.paths import cache_dir, perception_home

# Bump when the snapshot, feature or label definitions change: old caches stop matching.
CODE_VERSION = "data-v1"
KEY_VERSION = "key-v3"  # the input files enter the key by full-content sha256 (perception.data.digests)
MMAP_BYTES = 256 << 20  # features larger than this stay memory-mapped from the cache
_ARRAYS = ("features", "dt", "y", "mask", "segment")
TMP_SUFFIX = ".tmp"  # a build's temp directory: .<data_hash>.<random>.tmp, renamed into place when complete
BUILD_LOCK = "build.lock"


@dataclass
class Dataset:
    features: np.ndarray  # (T, F) float32, raw
    dt: np.ndarray  # (T,) float32 seconds since the previous snapshot
    y: np.ndarray  # (T, H) uint8
    mask: np.ndarray  # (T, H) bool
    segment: np.ndarray  # (T,) int32
    feature_names: list[str]
    horizons: list[int]
    data_hash: str
    drop_counts: dict[str, int]
    cache_path: Optional[Path] = None
    summary: Optional[dict] = None  # DBN builds: records read, instruments and their dates

    def __len__(self) -> int:
        return len(self.dt)


def data_hash(cfg: Any, digests: Optional[Path] = None) -> str:
    """sha256 of the data config without `fold`/`cache`/`workers`/`chunk_records`, each input file's
    full-content sha256 and CODE_VERSION. `digests`: the memo of those sha256s by (size, mtime_ns,
    inode) (perception.data.digests); without one every input is read whole."""
    cfg = as_data_config(cfg)
    d = dataclasses.asdict(cfg)
    for k in ("fold", "cache", "paths", "workers", "chunk_records"):
        d.pop(k)
    d["source"] = cfg.source.value
    if cfg.synthetic_world is SyntheticWorld.default:  # caches made before worlds existed stay valid
        d.pop("synthetic_world")
    else:
        d["synthetic_world"] = cfg.synthetic_world.value
    h = hashlib.sha256()
    h.update(CODE_VERSION.encode())
    h.update(json.dumps(d, sort_keys=True).encode())
    if cfg.source is DataSource.dbn:
        h.update(KEY_VERSION.encode())
        memo = DigestMemo(digests)
        for path in resolve_paths(cfg.paths):
            h.update(memo.digest(path).encode())
        memo.save()
    return h.hexdigest()[:20]


def load_dataset(cfg: Any, home: Optional[Path] = None, progress: bool = True, map_features: bool = False) -> Dataset:
    """The dataset, from the cache when built; `map_features` leaves cached features on disk
    (memory-mapped) whatever their size, as the cache-filling `perception-data build` does."""
    cfg = as_data_config(cfg)
    check_data_config(cfg)
    if not cfg.cache:
        ds = _build(cfg, data_hash(cfg), progress)
    else:
        root = cache_dir(home or perception_home())
        key = data_hash(cfg, root / DIGESTS_FILE)
        ds = _read_cache(root / key, map_features) or _build_into_cache(cfg, key, root, progress, map_features)
    _check_fits(cfg, ds)
    return ds


def _check_fits(cfg: DataConfig, ds: Dataset) -> None:
    starts = np.flatnonzero(np.r_[True, ds.segment[1:] != ds.segment[:-1]])
    longest = int(np.diff(np.r_[starts, len(ds.segment)]).max())
    for key, value in (("data.window", cfg.window), ("data.horizons[-1]", cfg.horizons[-1])):
        if value >= longest:
            raise ConfigError(
                f"{key}={value} is not shorter than the longest segment of the data "
                f"({longest} snapshots); use a smaller value or more data"
            )
    if cfg.window + cfg.horizons[0] > longest:
        raise ConfigError(
            f"data.window + data.horizons[0] = {cfg.window + cfg.horizons[0]} exceeds the longest "
            f"segment ({longest} snapshots): no window has a label"
        )


# ---------------------------------------------------------------- building


def build_snapshots(cfg: DataConfig, progress: bool = True) -> tuple[Snapshots, int, Counter]:
    """Snapshots, tick (1e-9 price units) and drop counts from the configured source (in memory)."""
    if cfg.source is DataSource.synthetic:
        from perception.data import synthetic  # scipy.signal: 2-3 s of imports a DBN build need not pay

        snaps = synthetic.generate(
            cfg.n_snapshots,
            cfg.synthetic_seed,
            cfg.horizons,
            cfg.window,
            cfg.snapshot_interval,
            cfg.synthetic_session,
            world=enum_value(cfg.synthetic_world),
        )
        return snaps, _tick(cfg, synthetic.TICK), Counter()
    with tempfile.TemporaryDirectory(prefix="perception-spill-") as spill:
        clock = ingest.clock_from_files(cfg, resolve_paths(cfg.paths), Path(spill), _names(cfg), progress)
        inferred = inferred_tick(clock) if cfg.tick_size is None else 0
        return clock.snapshots(), _tick(cfg, inferred), clock.counts


def _tick(cfg: DataConfig, inferred: int) -> int:
    return resolve_tick(cfg, inferred, _names(cfg))


# ------------------------------------------------------------- the in-memory oracle


def snapshots_in_memory(cfg: DataConfig, files: list[Path], counts: Counter) -> Snapshots:
    """Every file read whole, all records concatenated (in the order given) and put on the clock at
    once: the reference the streaming path must equal (files in time order)."""
    parts, symbols = [], {}
    for path in files:
        f = read_mbp10(path)
        if len(f.records) == 0:
            raise DataError(f"{path}: no MBP-10 records")
        parts.append(f.records)
        symbols.update(f.symbols)
    records = np.concatenate([_strip_ts_out(p) for p in parts])
    records = _select_instrument(cfg, files, records, symbols, counts)
    snaps = snapshots_from_records(records, cfg.snapshot_interval, cfg.max_gap, counts)
    if len(snaps) == 0:
        raise DataError(f"{_names(cfg)}: zero usable snapshots (dropped records by reason: {dict(counts)})")
    return snaps


def build_in_memory(cfg: Any) -> Dataset:
    """The whole-array build of a DBN config (no cache): the oracle of the equality tests."""
    cfg = as_data_config(cfg)
    counts: Counter = Counter()
    snaps = snapshots_in_memory(cfg, resolve_paths(cfg.paths), counts)
    tick = _tick(cfg, smallest_price_step(snaps))
    feats = compute_features(snaps, tick)
    y, mask = compute_labels(snaps, cfg.horizons)
    return _dataset(cfg, "", snaps, feats, y, mask, counts)


def _strip_ts_out(rec: np.ndarray) -> np.ndarray:
    from perception.data.dbn_io import MBP10_DTYPE

    return rec if rec.dtype == MBP10_DTYPE else np.array(rec[list(MBP10_DTYPE.names or ())], MBP10_DTYPE)


def _select_instrument(
    cfg: DataConfig, files: list[Path], records: np.ndarray, symbols: dict[str, int], counts: Counter
) -> np.ndarray:
    ids = np.unique(records["instrument_id"])
    if cfg.instrument is None:
        if len(ids) > 1:
            raise DataError(
                f"{_names(cfg)}: {len(ids)} instruments present ({ids.tolist()[:10]}; symbols "
                f"{sorted(symbols)[:10]}); choose one with data.instrument=<id or symbol>"
            )
        return records
    inst = str(cfg.instrument)
    target = int(inst) if inst.isdigit() else symbols.get(inst)
    if target is None or target not in ids:
        raise DataError(
            f"{_names(cfg)}: data.instrument={inst!r} is not in the files (instrument ids "
            f"{ids.tolist()[:10]}, symbols {sorted(symbols)[:10]})"
        )
    keep = records["instrument_id"] == target
    counts["other_instrument"] += int(np.count_nonzero(~keep))
    return records[keep]


def _names(cfg: DataConfig) -> str:
    if cfg.source is DataSource.synthetic:
        return "synthetic data"
    files = [str(p) for p in resolve_paths(cfg.paths)]
    return files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more files)"


def _build(cfg: DataConfig, key: str, progress: bool, out_dir: Optional[Path] = None) -> Dataset:
    if cfg.source is DataSource.dbn:
        return _build_dbn(cfg, key, progress, out_dir)
    bar = tqdm(total=3, desc="build data", unit="stage", disable=not progress)
    bar.set_postfix_str("snapshots")
    snaps, tick, counts = build_snapshots(cfg, progress)
    bar.update()
    bar.set_postfix_str("features")
    shape = (len(snaps), len(FEATURE_NAMES))
    out = None
    if out_dir is not None:
        out = np.lib.format.open_memmap(out_dir / "features.npy", mode="w+", dtype=np.float32, shape=shape)
    feats = compute_features(snaps, tick, out)
    bar.update()
    bar.set_postfix_str("labels")
    y, mask = compute_labels(snaps, cfg.horizons)
    if enum_value(cfg.synthetic_world) == "no_signal":
        from perception.data import synthetic

        y = synthetic.independent_labels(len(snaps), cfg.synthetic_seed, cfg.horizons, mask)
    bar.update()
    bar.close()
    return _dataset(cfg, key, snaps, feats, y, mask, counts)


def _build_dbn(cfg: DataConfig, key: str, progress: bool, out_dir: Optional[Path]) -> Dataset:
    """Streamed: the files' states spill into `out_dir` (or a temp directory), features are
    written to `out_dir/features.npy` block by block."""
    features_file = out_dir / "features.npy" if out_dir is not None else None
    with tempfile.TemporaryDirectory(prefix="perception-spill-", dir=out_dir) as spill:
        clock, feats, y, mask = ingest.build(
            cfg, resolve_paths(cfg.paths), Path(spill), _names(cfg), progress, features_file
        )
    return _dataset(cfg, key, clock, feats, y, mask, clock.counts, clock.summary)


def _dataset(
    cfg: DataConfig,
    key: str,
    timeline: Snapshots | Clock,
    feats: np.ndarray,
    y: np.ndarray,
    mask: np.ndarray,
    counts: Counter,
    summary: Optional[dict] = None,
) -> Dataset:
    """A build's Dataset: the snapshots' dt and segments (in memory, or a streamed build's clock), the
    features and labels computed on them, the drop counts by reason in name order."""
    return Dataset(
        feats,
        timeline.dt,
        y,
        mask,
        timeline.segment,
        list(FEATURE_NAMES),
        list(cfg.horizons),
        key,
        {k: int(v) for k, v in sorted(counts.items())},
        summary=summary,
    )


def _build_into_cache(cfg: DataConfig, key: str, root: Path, progress: bool, map_features: bool = False) -> Dataset:
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=TMP_SUFFIX, dir=root))
    try:
        with Lock(tmp / BUILD_LOCK, f"feature cache build {tmp.name}"):  # names this builder while it works
            ds = _build(cfg, key, progress, out_dir=tmp)
            if isinstance(ds.features, np.memmap) and ds.features.mode != "r":
                ds.features.flush()
            for name in _ARRAYS[1:]:
                np.save(tmp / f"{name}.npy", getattr(ds, name))
            meta = {
                "data_hash": key,
                "code_version": CODE_VERSION,
                "feature_names": ds.feature_names,
                "horizons": ds.horizons,
                "drop_counts": ds.drop_counts,
                "T": len(ds),
                "F": len(ds.feature_names),
                "summary": ds.summary,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            for p in tmp.iterdir():
                if p.is_file():
                    with open(p, "rb") as f:
                        os.fsync(f.fileno())
            del ds
        final = root / key
        try:
            os.rename(tmp, final)  # atomic; fails if another builder got there first
        except OSError:
            if _read_cache(final, map_features=True) is None:  # a broken leftover: move it aside, take its place
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cached = _read_cache(root / key, map_features)
    if cached is None:
        raise DataError(f"{root / key}: the feature cache just written cannot be read back")
    return cached


def remove_stale_builds(root: Path, say=lambda line: print(line, file=sys.stderr, flush=True)) -> list[Path]:
    """Removes the temp directories of builds whose builder is gone (killed, a lost node), with a
    notice each; returns them. A builder's lock (perception.locks) says whether it still runs: on this
    machine by its pid, elsewhere by its heartbeat. A directory with no lock (its builder died before
    taking it) is removed once untouched for the lock's stale time."""
    removed = []
    for tmp in sorted(root.glob(f".*{TMP_SUFFIX}")):
        try:
            if not tmp.is_dir():
                continue
            lock = Lock(tmp / BUILD_LOCK, f"feature cache build {tmp.name}", say=lambda line: None)
            if lock.path.exists():
                try:
                    lock.acquire()  # taken over only from a builder judged gone
                except LockHeld:
                    continue
                lock.release()
                why = "its builder is gone"
            else:
                idle = time.time() - tmp.stat().st_mtime
                if idle < lock.stale_s:
                    continue  # a builder between creating it and taking its lock
                why = f"no builder recorded, untouched for {idle:.0f} s"
            size = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
            shutil.rmtree(tmp)
        except (OSError, PerceptionError) as exc:
            say(f"[perception] could not remove the stale feature-cache build {tmp}: {exc}")
            continue
        removed.append(tmp)
        say(f"[perception] removed the stale feature-cache build {tmp} ({size / 1e6:.1f} MB): {why}")
    return removed


def _read_cache(path: Path, map_features: bool = False) -> Optional[Dataset]:
    """The cached dataset, or None when absent or incomplete."""
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        arrays = {}
        for name in _ARRAYS:
            file = path / f"{name}.npy"
            big = name == "features" and (map_features or file.stat().st_size > MMAP_BYTES)
            arrays[name] = np.load(file, mmap_mode="r" if big else None)
    except (OSError, ValueError):
        return None
    T = meta["T"]
    if arrays["features"].shape != (T, meta["F"]) or any(len(a) != T for a in arrays.values()):
        return None
    return Dataset(
        feature_names=meta["feature_names"],
        horizons=meta["horizons"],
        data_hash=meta["data_hash"],
        drop_counts=meta["drop_counts"],
        cache_path=path,
        summary=meta.get("summary"),
        **arrays,
    )
