"""The per-horizon effect study (perception/studies/per_horizon_effect.py; studies/per_horizon_effect.py's
`--report` writes its summary): the trainer's last epoch line read back, and the per-horizon effect
(a seed's mean over its folds, then mean and sd over seeds) kept apart by world, arms, overrides and mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perception.studies.per_horizon_effect as effect

STUDY = Path(__file__).resolve().parents[2] / "studies" / "per_horizon_effect.py"

LINE = (
    "[perception] per_horizon-f0 epoch {e}/4: val_auc_h2=0.71 val_auc_h40=0.62 val_auc_mean=0.66 "
    "query_divergence=0.3 attention_entropy_ratio=0.5 query_drift=2.0"
)


def test_last_epoch_reads_the_final_line_and_refuses_an_unfinished_run():
    out = "\n".join(["noise", LINE.format(e=3), LINE.format(e=4).replace("0.62", "0.64"), "[perception] finished"])
    last = effect.last_epoch(out)
    assert last["val_auc_h40"] == 0.64 and last["query_divergence"] == 0.3
    assert effect.last_epoch("\n".join([LINE.format(e=2), LINE.format(e=3)])) is None
    assert effect.last_epoch("a run that crashed") is None


def row(seed: int, ph: list[list[float]], skip: list[list[float]], extra=("trainer.epochs=4",)) -> dict:
    diag = {k: 0.1 for k in effect.DIAGNOSTICS}
    return {
        "world": "per_horizon",
        "seed": seed,
        "arms": ["per_horizon", "shared_skip"],
        "extra": list(extra),
        "mode": "trainer folds [0, 1]",
        "seconds": 5.0,
        "machine": "m",
        "horizons": [2, 40],
        "auc": {"per_horizon": ph, "shared_skip": skip},
        "decision": None,
        "verdict": None,
        "W": None,
        "diagnostics": {"per_horizon": diag, "shared_skip": diag},
    }


def test_summary_gives_mean_and_sd_over_seeds_of_the_fold_mean_effect(tmp_path):
    rows = [
        row(1, [[0.70, 0.60], [0.72, 0.64]], [[0.70, 0.58], [0.70, 0.58]]),  # h40 effect 0.04
        row(2, [[0.70, 0.60], [0.70, 0.62]], [[0.71, 0.60], [0.71, 0.60]]),  # h40 effect 0.01
        row(3, [[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]], extra=("trainer.epochs=8",)),
    ]
    doc = effect.summarize(rows)
    # the study's report writes that summary
    (tmp_path / "per_horizon_effect_runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [sys.executable, str(STUDY), "--report"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PERCEPTION_EFFECT_RESULTS": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "per_horizon_effect.json").read_text()) == doc
    by = {tuple(s["extra"]): s for s in doc["settings"]}
    assert set(by) == {("trainer.epochs=4",), ("trainer.epochs=8",)}
    four = by[("trainer.epochs=4",)]
    assert four["n_seeds"] == 2 and list(four["contrasts"]) == ["per_horizon - shared_skip"]
    h40 = four["contrasts"]["per_horizon - shared_skip"]["h40"]
    assert h40["mean"] == pytest.approx(0.025) and h40["sd"] == pytest.approx(np.std([0.04, 0.01], ddof=1))
    assert h40["positive"] == 2
    assert four["contrasts"]["per_horizon - shared_skip"]["h2"]["mean"] == pytest.approx(0.0)
