"""Small MBP-10 record arrays and data configs for the data tests."""

from __future__ import annotations

import numpy as np

from perception.data.config import DataConfig, DataSource
from perception.data.dbn_io import F_LAST, N_LEVELS, empty_records

T0 = 1_704_103_200_000_000_000  # 2024-01-01 10:00 UTC, ns
TICK = 250_000_000  # 0.25


def make_records(times_s, bid0_ticks=20_000, spread=1, **fields) -> np.ndarray:
    """One complete ten-level book per time (seconds after T0); `fields` override per record."""
    times_s = np.asarray(times_s, dtype=np.float64)
    rec = empty_records(len(times_s))
    rec["ts_recv"] = T0 + np.rint(times_s * 1e9).astype(np.int64)
    rec["ts_event"] = rec["ts_recv"] - 1000
    rec["instrument_id"] = 7
    bid0 = np.broadcast_to(np.asarray(bid0_ticks, np.int64), times_s.shape)
    for i in range(N_LEVELS):
        rec[f"bid_px_{i:02d}"] = (bid0 - i) * TICK
        rec[f"ask_px_{i:02d}"] = (bid0 + spread + i) * TICK
        rec[f"bid_sz_{i:02d}"] = 10 + i
        rec[f"ask_sz_{i:02d}"] = 20 + i
        rec[f"bid_ct_{i:02d}"] = 1 + i
        rec[f"ask_ct_{i:02d}"] = 2 + i
    rec["flags"] = F_LAST
    for name, value in fields.items():
        rec[name] = value
    return rec


def dbn_config(paths, **kw) -> DataConfig:
    base = dict(
        source=DataSource.dbn,
        paths=[str(p) for p in paths],
        window=2,
        window_stride=1,
        horizons=[1, 2],
        n_folds=2,
        cache=False,
    )
    base.update(kw)
    return DataConfig(**base)
