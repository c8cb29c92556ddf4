"""Snapshots -> raw features [T, F] float32 and labels y, mask [T, H] (DESIGN §4).

Features per level i (0..9): price distance to the mid in ticks (bid, ask), log1p sizes and
log1p order counts (bid, ask); then the mid log-return, spread in ticks, level-0 and cumulative
depth imbalance, and log Δt. An empty level sits one tick beyond the level above it, size 0.
"""

from __future__ import annotations

import numpy as np

from perception.data.book import Snapshots
from perception.data.dbn_io import N_LEVELS, UNDEF_PRICE

_PER_LEVEL = ("bid_dist", "ask_dist", "bid_sz", "ask_sz", "bid_ct", "ask_ct")
_GLOBAL = ("mid_logret", "spread_ticks", "imbalance_l0", "imbalance_cum", "log_dt")
FEATURE_NAMES = [f"{n}_{i}" for i in range(N_LEVELS) for n in _PER_LEVEL] + list(_GLOBAL)


def mid2(snaps: Snapshots) -> np.ndarray:
    """Twice the mid price, (T,) int64: exact on the tick grid."""
    return snaps.bid_px[:, 0] + snaps.ask_px[:, 0]


def compute_features(snaps: Snapshots, tick: int, out: np.ndarray | None = None) -> np.ndarray:
    """(T, F) float32; `out` may be a preallocated (memory-mapped) array."""
    T = len(snaps)
    feats = out if out is not None else np.empty((T, len(FEATURE_NAMES)), np.float32)
    m2 = mid2(snaps)
    mid = m2.astype(np.float64) * 0.5
    bid_dist = _distances(mid[:, None] - snaps.bid_px, snaps.bid_px, tick)  # (T, 10)
    ask_dist = _distances(snaps.ask_px - mid[:, None], snaps.ask_px, tick)
    cols = 6
    feats[:, 0 : N_LEVELS * cols : cols] = bid_dist
    feats[:, 1 : N_LEVELS * cols : cols] = ask_dist
    feats[:, 2 : N_LEVELS * cols : cols] = np.log1p(snaps.bid_sz, dtype=np.float32)
    feats[:, 3 : N_LEVELS * cols : cols] = np.log1p(snaps.ask_sz, dtype=np.float32)
    feats[:, 4 : N_LEVELS * cols : cols] = np.log1p(snaps.bid_ct, dtype=np.float32)
    feats[:, 5 : N_LEVELS * cols : cols] = np.log1p(snaps.ask_ct, dtype=np.float32)

    g = N_LEVELS * cols
    logret = np.zeros(T)
    logret[1:] = np.log(mid[1:] / mid[:-1])
    logret[_segment_starts(snaps.segment)] = 0.0  # no return across a segment end
    feats[:, g] = logret
    feats[:, g + 1] = (snaps.ask_px[:, 0] - snaps.bid_px[:, 0]) / tick
    b0 = snaps.bid_sz[:, 0].astype(np.float64)
    a0 = snaps.ask_sz[:, 0].astype(np.float64)
    feats[:, g + 2] = (b0 - a0) / np.maximum(b0 + a0, 1.0)
    bc = snaps.bid_sz.sum(axis=1, dtype=np.float64)
    ac = snaps.ask_sz.sum(axis=1, dtype=np.float64)
    feats[:, g + 3] = (bc - ac) / np.maximum(bc + ac, 1.0)
    feats[:, g + 4] = np.log(snaps.dt)
    return feats


def _distances(dist: np.ndarray, px: np.ndarray, tick: int) -> np.ndarray:
    """Distance to the mid in ticks; an empty level is one tick beyond the one above it."""
    d = dist / tick
    empty = px == UNDEF_PRICE
    if empty.any():
        for i in range(N_LEVELS):  # 10 levels, vectorised over T
            prev = d[:, i - 1] + 1.0 if i else np.full(len(d), 0.5)
            d[:, i] = np.where(empty[:, i], prev, d[:, i])
    return d


def _segment_starts(segment: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])


def segment_ends(segment: np.ndarray) -> np.ndarray:
    """(T,) index of the last snapshot of each snapshot's segment."""
    last = np.flatnonzero(np.r_[segment[1:] != segment[:-1], True])
    return last[np.searchsorted(last, np.arange(len(segment)))]


def compute_labels(snaps: Snapshots, horizons: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """y_h[t] = mid[t+h] > mid[t] (uint8), mask False where t+h lies past the segment end."""
    return labels_from_mid2(mid2(snaps), snaps.segment, horizons)


def labels_from_mid2(
    m2: np.ndarray, segment: np.ndarray, horizons: list[int], block: int = 1 << 16
) -> tuple[np.ndarray, np.ndarray]:
    """compute_labels from twice the mid (T,) and the segments (T,) alone; `block` rows at a time,
    so the temporaries are a block's, not T's."""
    T = len(m2)
    last = np.flatnonzero(np.r_[segment[1:] != segment[:-1], True])  # each segment's last row
    y = np.zeros((T, len(horizons)), np.uint8)
    mask = np.zeros((T, len(horizons)), bool)
    for a in range(0, T, block):
        b = min(a + block, T)
        t = np.arange(a, b)
        end = last[np.searchsorted(last, t)]
        for j, h in enumerate(horizons):  # H horizons, vectorised over the block
            valid = t + h <= end
            mask[a:b, j] = valid
            ahead = np.minimum(t + h, T - 1)
            y[a:b, j] = (m2[ahead] > m2[a:b]) & valid
    return y, mask
