"""A sweep's lanes (side-by-side trainings, a GPU or a CPU core each) write each run's train.log once:
the training's output goes into the file its own log already is, and nothing is written twice."""

from __future__ import annotations

import os
import subprocess

import pytest

from perception.run_id import RunId


@pytest.mark.slow(seconds=130)
def test_every_line_of_a_lane_s_train_log_is_written_once(perception_home):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    r = subprocess.run(
        [
            "perception-sweep",
            "local",
            "--cpu-workers",
            "2",
            "--sweep-id",
            "lanes",
            "experiment=ci",
            "trainer.epochs=1",
            "data.n_folds=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert "4/4 runs finished" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert "on CPU (log " in r.stderr  # the lanes ran, each with its log
    for arm in ("shared", "per_horizon"):
        for fold in (0, 1):
            name = f"{arm}-f{fold}"
            lines = (RunId("lanes", arm, fold).directory(perception_home) / "train.log").read_text().splitlines()
            assert sum(ln.startswith("---- ") for ln in lines) == 1, lines
            assert sum(ln.startswith(f"[perception] {name} epoch 1/1: val_auc_h2=") for ln in lines) == 1, lines
            assert sum(ln.startswith(f"[perception] finished {name} ") for ln in lines) == 1, lines
            doubled = sorted({ln for ln in lines if lines.count(ln) > 1})
            assert not doubled, f"{name}: written twice: {doubled}"
