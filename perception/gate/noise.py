"""Training noise measured by A/A sweeps and shipped with the package (perception/gate/noise/*.json).

With one replicate a sweep cannot see its own training noise: two fixed trained models are all the
block bootstrap resamples. When a sweep's runs match an A/A measurement (same experiment, epochs,
data scale and precision), the gate adds that measured per-cell variance of the lift to the evidence and names the
file; otherwise the report says plainly that training noise is not covered.

A file: {"match": {param: value, ...}, "horizons": [...], "arms": {arm: {"cov": (H, H), "n_cells": n}},
"source": "how it was measured"}. `cov` is the mean outer product of the per-(sweep, fold) AUC
differences Δ_h of an arm against its twin (its expected value is 0, so uncentred).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np

from perception.contract import param

# Params that set the size of training noise: an A/A measurement applies only where they all agree.
# The precision too: a calibration at tf32 says nothing about bf16 runs (a run without it counts as fp32).
MATCH_KEYS = ("experiment", "trainer.epochs", "data.window", "data.window_stride", "data.horizons",
              "data.n_snapshots", "model.d_model", "trainer.max_train_batches", "trainer.precision")


@dataclass(frozen=True)
class TrainingNoise:
    source: str  # the file's path (perception-sweep calibrate writes it)
    horizons: list[int]
    covs: dict[str, np.ndarray]  # arm -> (H, H) per-cell covariance of Δ under no effect
    n_cells: dict[str, int]

    def cell_variance(self, weights: np.ndarray) -> tuple[float, int]:
        """(variance, degrees of freedom) of one cell's lift Σ w_h Δ_h / Σ w_h: the widest of the
        measured arms, with as many degrees of freedom as it has cells (uncentred: the mean is 0)."""
        w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
        arm = max(self.covs, key=lambda a: float(w @ self.covs[a] @ w))
        return float(w @ self.covs[arm] @ w), self.n_cells[arm]


NOISE_DIR_ENV = "PERCEPTION_GATE_NOISE_DIR"  # a folder of measurements of one's own, read before the shipped ones


def noise_dir() -> Path:
    """Where `perception-sweep calibrate` writes: $PERCEPTION_GATE_NOISE_DIR, else the package's folder."""
    return Path(os.environ[NOISE_DIR_ENV]) if os.environ.get(NOISE_DIR_ENV) else shipped_dir()


def shipped_dir() -> Path:
    return Path(str(resources.files("perception.gate") / "noise"))


def matching_noise(params: dict[str, str], horizons: list[int], folder: Optional[Path] = None) -> Optional[TrainingNoise]:
    """The measurement whose `match` agrees with every one of the runs' params, if any: in `folder`, else
    in $PERCEPTION_GATE_NOISE_DIR and then the shipped folder."""
    folders = [folder] if folder is not None else list(dict.fromkeys([noise_dir(), shipped_dir()]))
    paths = [p for f in folders if f.is_dir() for p in sorted(f.glob("*.json"))]
    for path in paths:
        doc = json.loads(path.read_text())
        if doc.get("horizons") != horizons:
            continue
        if all(str(param(params, k)) == str(v) for k, v in doc["match"].items()):
            covs = {arm: np.asarray(m["cov"], dtype=np.float64) for arm, m in doc["arms"].items()}
            return TrainingNoise(str(path), horizons, covs, {arm: int(m["n_cells"]) for arm, m in doc["arms"].items()})
    return None


def measure(deltas_by_arm: dict[str, np.ndarray]) -> dict[str, dict]:
    """deltas_by_arm: arm -> (n_cells, H) A/A differences -> the file's "arms" entry."""
    return {arm: {"cov": (d.T @ d / len(d)).tolist(), "n_cells": int(len(d))} for arm, d in deltas_by_arm.items()}
