"""Purged K-fold with embargo over window end points (DESIGN §4).

Window end t reads [t-K+1, t] and is labelled from (t, t+h_max]: its span is [t-K+1, t+h_max]
(closed). Eligible ends lie on the stride grid (t = K-1 mod stride), with the whole window inside
one segment and at least the shortest label inside it. The eligible ends split into n_folds
contiguous blocks; the validation block's span is the union of its windows' spans. Training keeps
the other ends except those whose span meets the validation span (purge) or whose window starts
within `embargo` snapshots after it (embargo, default h_max).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perception.data.checks import as_data_config
from perception.data.features import segment_ends
from perception.errors import ConfigError


@dataclass
class FoldSplit:
    train_ends: np.ndarray  # (N_train,) int64 window end indices, ascending
    val_ends: np.ndarray  # (N_val,) int64


def eligible_ends(segment: np.ndarray, window: int, stride: int, h_min: int) -> np.ndarray:
    """Window ends on the stride grid whose window and shortest label stay inside one segment."""
    T = len(segment)
    t = np.arange(window - 1, T, stride, dtype=np.int64)
    if len(t) == 0:
        return t
    seg_end = segment_ends(segment)
    inside = (segment[t - window + 1] == segment[t]) & (t + h_min <= seg_end[t])
    return t[inside]


def purged_split(ds: Any, cfg: Any) -> FoldSplit:
    cfg = as_data_config(cfg)
    K, h_max = cfg.window, cfg.horizons[-1]
    embargo = h_max if cfg.embargo is None else cfg.embargo
    ends = eligible_ends(np.asarray(ds.segment), K, cfg.window_stride, cfg.horizons[0])
    if len(ends) < cfg.n_folds:
        raise ConfigError(
            f"data.n_folds={cfg.n_folds}: only {len(ends)} eligible windows (data.window={K}, "
            f"data.window_stride={cfg.window_stride}, shortest horizon {cfg.horizons[0]}, "
            f"{len(ds.segment)} snapshots); need at least one per fold"
        )
    if not 0 <= cfg.fold < cfg.n_folds:
        raise ConfigError(f"data.fold={cfg.fold}: expected an integer in 0..{cfg.n_folds - 1}")
    blocks = np.array_split(ends, cfg.n_folds)
    val = blocks[cfg.fold]
    span_lo, span_hi = val[0] - K + 1, val[-1] + h_max  # union of the block's spans (closed)
    rest = np.concatenate([b for i, b in enumerate(blocks) if i != cfg.fold])
    starts = rest - K + 1
    overlaps = (starts <= span_hi) & (rest + h_max >= span_lo)
    embargoed = (starts > span_hi) & (starts <= span_hi + embargo)
    train = rest[~overlaps & ~embargoed]
    if len(train) == 0:
        raise ConfigError(
            f"data.fold={cfg.fold}: no training window survives the purge and embargo "
            f"(data.window={K}, h_max={h_max}, data.embargo={embargo}, {len(ends)} eligible windows)"
        )
    return FoldSplit(train_ends=train.astype(np.int64), val_ends=val.astype(np.int64))
