"""Training noise measured by A/A sweeps: one's own under PERCEPTION_HOME, and some shipped with the
package (perception/gate/noise/*.json).

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
from perception.errors import ConfigError
from perception.paths import perception_home

# Params that set the size of training noise: an A/A measurement applies only where they all agree.
# The precision too: a calibration at tf32 says nothing about bf16 runs (a run without it counts as fp32);
# and the SSD's kernels and chunk, the VSN's folded embedding and fused GRN, which the gate also requires to
# agree (a run without the param counts as chunked, unfolded, unfused).
MATCH_KEYS = (
    "experiment",
    "trainer.epochs",
    "data.window",
    "data.window_stride",
    "data.horizons",
    "data.n_snapshots",
    "model.d_model",
    "trainer.max_train_batches",
    "trainer.precision",
    "model.mamba.ssd",
    "model.vsn.fold_embed",
    "model.mamba.chunk",
    "model.vsn.fused_grn",
)


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


NOISE_DIR_ENV = "PERCEPTION_GATE_NOISE_DIR"  # another folder for one's own measurements (a workflow's runs volume)


def noise_dir(home: Optional[Path] = None) -> Path:
    """One's own measurements, where `perception-sweep calibrate` writes by default and the gate looks
    first: $PERCEPTION_GATE_NOISE_DIR where set, else $PERCEPTION_HOME/noise. The installed package is
    written only when asked (`calibrate --into-package`), so a calibration never edits an install."""
    if os.environ.get(NOISE_DIR_ENV):
        return Path(os.environ[NOISE_DIR_ENV]).expanduser().resolve()
    return (home or perception_home()) / "noise"


def shipped_dir() -> Path:
    """The measurements shipped with the package, read after one's own."""
    return Path(str(resources.files("perception.gate") / "noise"))


def noise_folders() -> list[Path]:
    """The gate's lookup order: one's own folder, then the shipped one (once, where they are the same)."""
    return list(dict.fromkeys(f.resolve() for f in (noise_dir(), shipped_dir())))


def matching_noise(
    params: dict[str, str], horizons: list[int], folder: Optional[Path] = None
) -> Optional[TrainingNoise]:
    """The first measurement whose horizons are the runs' and whose `match` agrees with every one of the
    runs' params: in `folder`, else in `noise_folders()` order, each folder's files by name. A file of
    one's own that does not match is passed over, so a shipped one that does still applies."""
    folders = [folder] if folder is not None else noise_folders()
    paths = [p for f in folders if f.is_dir() for p in sorted(f.glob("*.json"))]
    for path in paths:
        doc = _read(path)
        if doc["horizons"] != horizons:
            continue
        if all(str(param(params, k)) == str(v) for k, v in doc["match"].items()):
            covs = {arm: np.asarray(m["cov"], dtype=np.float64) for arm, m in doc["arms"].items()}
            return TrainingNoise(str(path), horizons, covs, {arm: int(m["n_cells"]) for arm, m in doc["arms"].items()})
    return None


def _read(path: Path) -> dict:
    """A noise file's document; a ConfigError naming the file and what was expected otherwise."""
    expected = 'expected a noise file: {"match": {...}, "horizons": [...], "arms": {arm: {"cov", "n_cells"}}}'
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"noise file {path}: unreadable ({exc}); {expected}") from None
    ok = (
        isinstance(doc, dict)
        and isinstance(doc.get("match"), dict)
        and isinstance(doc.get("horizons"), list)
        and isinstance(doc.get("arms"), dict)
        and all(isinstance(m, dict) and {"cov", "n_cells"} <= set(m) for m in doc["arms"].values())
    )
    if not ok:
        raise ConfigError(f"noise file {path}: {expected}")
    return doc


def measure(deltas_by_arm: dict[str, np.ndarray]) -> dict[str, dict]:
    """deltas_by_arm: arm -> (n_cells, H) A/A differences -> the file's "arms" entry."""
    return {arm: {"cov": (d.T @ d / len(d)).tolist(), "n_cells": int(len(d))} for arm, d in deltas_by_arm.items()}
