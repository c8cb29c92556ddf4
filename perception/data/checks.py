"""Fast validation of the data config (no data loaded): every error names the key and what is allowed."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path
from typing import Any

from perception.data.config import DataConfig, DataSource, SyntheticWorld
from perception.enums import as_enum
from perception.errors import ConfigError


def as_data_config(cfg: Any) -> DataConfig:
    """A DataConfig from a DataConfig, an OmegaConf node or a mapping (enums restored)."""
    if isinstance(cfg, DataConfig):
        out = dataclasses.replace(cfg)
    else:
        if type(cfg).__module__.startswith("omegaconf"):
            from omegaconf import OmegaConf

            cfg = OmegaConf.to_container(cfg, resolve=True)
        if not isinstance(cfg, dict):
            raise ConfigError(f"data config: expected a DataConfig or mapping, got {type(cfg).__name__}")
        known = {f.name for f in dataclasses.fields(DataConfig)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ConfigError(f"data config: unknown key(s) {unknown}; allowed: {sorted(known)}")
        out = DataConfig(**cfg)
    out.source = as_enum(DataSource, out.source, "data.source")
    out.synthetic_world = as_enum(SyntheticWorld, out.synthetic_world, "data.synthetic_world")
    out.horizons = [int(h) for h in out.horizons] if _is_int_list(out.horizons) else out.horizons
    out.paths = list(out.paths)
    return out


def _is_int_list(v: Any) -> bool:
    try:
        return all(int(h) == h for h in v)
    except (TypeError, ValueError):
        return False


def resolve_paths(paths: list[str]) -> list[Path]:
    """Every file the paths/globs name, each pattern's matches sorted; a pattern matching nothing
    is a ConfigError naming it."""
    out: list[Path] = []
    for pattern in paths:
        expanded = str(Path(pattern).expanduser())
        matches = (
            sorted(glob.glob(expanded)) if glob.has_magic(expanded) else ([expanded] if Path(expanded).exists() else [])
        )
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise ConfigError(f"data.paths: {pattern!r} matches no file")
        out.extend(files)
    return out


def check_data_config(cfg: Any) -> None:
    cfg = as_data_config(cfg)
    h = cfg.horizons
    if not _is_int_list(h) or not h or any(x < 1 for x in h) or any(b <= a for a, b in zip(h, h[1:])):
        raise ConfigError(f"data.horizons={h!r}: expected a non-empty, strictly ascending list of positive integers")
    _at_least("data.window", cfg.window, 1)
    _at_least("data.window_stride", cfg.window_stride, 1)
    _at_least("data.n_folds", cfg.n_folds, 2)
    if not isinstance(cfg.fold, int) or not 0 <= cfg.fold < cfg.n_folds:
        raise ConfigError(f"data.fold={cfg.fold!r}: expected an integer in 0..{cfg.n_folds - 1}")
    if cfg.embargo is not None:
        _at_least("data.embargo", cfg.embargo, 0)
    if not cfg.snapshot_interval > 0:
        raise ConfigError(f"data.snapshot_interval={cfg.snapshot_interval!r}: expected seconds > 0")
    if not cfg.max_gap >= cfg.snapshot_interval:
        raise ConfigError(
            f"data.max_gap={cfg.max_gap!r}: expected seconds >= data.snapshot_interval ({cfg.snapshot_interval})"
        )
    if cfg.workers is not None:
        _at_least("data.workers", cfg.workers, 1)
    _at_least("data.chunk_records", cfg.chunk_records, 1)
    if cfg.tick_size is not None and not cfg.tick_size > 0:
        raise ConfigError(f"data.tick_size={cfg.tick_size!r}: expected a price step > 0 or null")
    if cfg.source is DataSource.synthetic:
        _at_least("data.n_snapshots", cfg.n_snapshots, 2)
        _at_least("data.synthetic_session", cfg.synthetic_session, 2)
    else:
        if not cfg.paths:
            raise ConfigError(
                "data.paths is empty: data.source=dbn needs DBN files or globs, e.g. 'data.paths=[/data/ES/*.dbn.zst]'"
            )
        resolve_paths(cfg.paths)


def _at_least(key: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{key}={value!r}: expected an integer >= {low}")
