"""`load_dataset`: books -> snapshots -> raw features and labels, through the feature cache.

The cache (`PERCEPTION_HOME/cache/<data_hash>/`) holds raw features and labels for all folds;
z-scoring happens later with the training fold's statistics. A build writes into a temp
directory and renames it into place, so concurrent builders leave one complete cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from tqdm.auto import tqdm

from perception.data import synthetic
from perception.enums import enum_value
from perception.data.book import Snapshots, smallest_price_step, snapshots_from_records
from perception.data.checks import as_data_config, check_data_config, resolve_paths
from perception.data.config import DataConfig, DataSource, SyntheticWorld
from perception.data.dbn_io import PRICE_SCALE, read_mbp10
from perception.data.features import FEATURE_NAMES, compute_features, compute_labels
from perception.errors import ConfigError, DataError
from perception.paths import cache_dir, perception_home

# Bump when the snapshot, feature or label definitions change: old caches stop matching.
CODE_VERSION = "data-v1"
MMAP_BYTES = 256 << 20  # features larger than this stay memory-mapped from the cache
_ARRAYS = ("features", "dt", "y", "mask", "segment")


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

    def __len__(self) -> int:
        return len(self.dt)


def data_hash(cfg: Any) -> str:
    """sha256 of the data config without `fold`/`cache`, the input files' bytes and CODE_VERSION."""
    cfg = as_data_config(cfg)
    d = dataclasses.asdict(cfg)
    for k in ("fold", "cache", "paths"):
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
        for path in resolve_paths(cfg.paths):
            h.update(_file_sha256(path).encode())
    return h.hexdigest()[:20]


def _file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_dataset(cfg: Any, home: Optional[Path] = None, progress: bool = True) -> Dataset:
    cfg = as_data_config(cfg)
    check_data_config(cfg)
    key = data_hash(cfg)
    if not cfg.cache:
        ds = _build(cfg, key, progress)
    else:
        root = cache_dir(home or perception_home())
        ds = _read_cache(root / key) or _build_into_cache(cfg, key, root, progress)
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
    """Snapshots, tick (1e-9 price units) and drop counts from the configured source."""
    counts: Counter = Counter()
    if cfg.source is DataSource.synthetic:
        snaps = synthetic.generate(cfg.n_snapshots, cfg.synthetic_seed, cfg.horizons, cfg.window,
                                   cfg.snapshot_interval, cfg.synthetic_session,
                                   world=enum_value(cfg.synthetic_world))
        tick = synthetic.TICK
    else:
        snaps = _snapshots_from_files(cfg, resolve_paths(cfg.paths), counts, progress)
        tick = smallest_price_step(snaps)
    if cfg.tick_size is not None:
        tick = int(round(cfg.tick_size / PRICE_SCALE))
    if tick <= 0:
        raise DataError(f"{_names(cfg)}: cannot infer a tick size (one price level seen); set data.tick_size")
    return snaps, tick, counts


def _snapshots_from_files(cfg: DataConfig, files: list[Path], counts: Counter,
                          progress: bool) -> Snapshots:
    parts, symbols = [], {}
    bar = tqdm(files, desc="read DBN", unit="file", disable=not progress)
    for path in bar:
        f = read_mbp10(path)
        if len(f.records) == 0:
            raise DataError(f"{path}: no MBP-10 records")
        parts.append(f.records)
        symbols.update(f.symbols)
    records = np.concatenate([_strip_ts_out(p) for p in parts])
    records = _select_instrument(cfg, files, records, symbols, counts)
    snaps = snapshots_from_records(records, cfg.snapshot_interval, cfg.max_gap, counts)
    if len(snaps) == 0:
        raise DataError(
            f"{_names(cfg)}: zero usable snapshots (dropped records by reason: {dict(counts)})"
        )
    return snaps


def _strip_ts_out(rec: np.ndarray) -> np.ndarray:
    from perception.data.dbn_io import MBP10_DTYPE

    return rec if rec.dtype == MBP10_DTYPE else np.array(rec[list(MBP10_DTYPE.names)], MBP10_DTYPE)


def _select_instrument(cfg: DataConfig, files: list[Path], records: np.ndarray,
                       symbols: dict[str, int], counts: Counter) -> np.ndarray:
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
    if cfg.source is DataSource.synthetic and enum_value(cfg.synthetic_world) == "no_signal":
        y = synthetic.independent_labels(len(snaps), cfg.synthetic_seed, cfg.horizons, mask)
    bar.update()
    bar.close()
    return Dataset(feats, snaps.dt, y, mask, snaps.segment, list(FEATURE_NAMES), list(cfg.horizons),
                   key, {k: int(v) for k, v in sorted(counts.items())})


def _build_into_cache(cfg: DataConfig, key: str, root: Path, progress: bool) -> Dataset:
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=root))
    try:
        ds = _build(cfg, key, progress, out_dir=tmp)
        ds.features.flush()
        for name in _ARRAYS[1:]:
            np.save(tmp / f"{name}.npy", getattr(ds, name))
        meta = {"data_hash": key, "code_version": CODE_VERSION, "feature_names": ds.feature_names,
                "horizons": ds.horizons, "drop_counts": ds.drop_counts, "T": len(ds),
                "F": len(ds.feature_names)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        for p in tmp.iterdir():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        del ds
        final = root / key
        try:
            os.rename(tmp, final)  # atomic; fails if another builder got there first
        except OSError:
            if _read_cache(final) is None:  # a broken leftover: move it aside, take its place
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ds = _read_cache(root / key)
    if ds is None:
        raise DataError(f"{root / key}: the feature cache just written cannot be read back")
    return ds


def _read_cache(path: Path) -> Optional[Dataset]:
    """The cached dataset, or None when absent or incomplete."""
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        arrays = {}
        for name in _ARRAYS:
            file = path / f"{name}.npy"
            big = name == "features" and file.stat().st_size > MMAP_BYTES
            arrays[name] = np.load(file, mmap_mode="r" if big else None)
    except (OSError, ValueError):
        return None
    T = meta["T"]
    if arrays["features"].shape != (T, meta["F"]) or any(len(a) != T for a in arrays.values()):
        return None
    return Dataset(feature_names=meta["feature_names"], horizons=meta["horizons"],
                   data_hash=meta["data_hash"], drop_counts=meta["drop_counts"], cache_path=path,
                   **arrays)
