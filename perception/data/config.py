"""Data configuration (`conf/data/*.yaml`). Every key but `fold`, `cache`, `workers` and
`chunk_records` (which do not change the data) enters the data hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class DataSource(str, Enum):
    synthetic = "synthetic"
    dbn = "dbn"


class SyntheticWorld(str, Enum):
    """Synthetic worlds with a known answer, to measure the gate (perception/data/synthetic.py)."""

    default = "default"  # fast order-flow imbalance and a slow regime: any pooled context helps
    no_signal = "no_signal"  # labels independent of the features: no arm beats AUC 0.5 beyond noise
    per_horizon = "per_horizon"  # short and longest horizons decided by different look-alike events
    per_horizon_null = "per_horizon_null"  # per_horizon's books and labels, the events' sides independent
    per_horizon_extremes = "per_horizon_extremes"  # a burst's weakest decides h_s, its strongest h_max
    per_horizon_extremes_null = "per_horizon_extremes_null"  # its books and labels, the sides independent


@dataclass
class DataConfig:
    source: DataSource = DataSource.synthetic
    # DBN inputs (`source=dbn`): files or globs, read in time order.
    paths: list[str] = field(default_factory=list)
    # instrument_id (digits), a raw symbol (ESH4) or a continuous / parent symbol in the files'
    # symbology (ES.c.0), resolved per date; None takes the only instrument present.
    instrument: Optional[str] = None
    workers: Optional[int] = None  # threads reading files; None: the cores available
    chunk_records: int = 262_144  # records in memory at a time (96 MB), shared by the workers
    snapshot_interval: float = 1.0  # seconds between snapshots on the fixed clock
    max_gap: float = 60.0  # longer gaps end a segment
    tick_size: Optional[float] = None  # None: smallest positive price step seen
    # synthetic books
    n_snapshots: int = 200_000
    synthetic_seed: int = 0
    synthetic_world: SyntheticWorld = SyntheticWorld.default
    synthetic_session: int = 82_800  # snapshots per synthetic session (23 h at 1 s); a 1 h break ends it
    # windows, labels, folds
    window: int = 256  # K
    window_stride: int = 8
    horizons: list[int] = field(default_factory=lambda: [30, 100, 300, 1000, 6000])
    n_folds: int = 3
    fold: int = 0
    embargo: Optional[int] = None  # None: h_max
    cache: bool = True
