"""A SIGKILLed run resumes from its last checkpoint and ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from tests.train.helpers import cli, final_predictions

# Full ci epochs (every training window), so a kill lands inside an epoch.
ARGS = ["experiment=ci", "trainer.epochs=3", "trainer.max_train_batches=null", "trainer.num_threads=1"]


def _exact_metrics(run_dir):
    metrics = json.loads((run_dir / "done.json").read_text())["metrics"]
    metrics.pop("samples_per_s")  # wall-clock rate: the only value allowed to differ
    return metrics


@pytest.mark.slow(seconds=65)
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(perception_home):
    ref = cli("perception-train", *ARGS, "sweep_id=uninterrupted", home=perception_home)
    assert ref.returncode == 0, ref.stderr[-3000:]

    run_dir = perception_home / "runs" / "killed" / "shared-f0"
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [shutil.which("perception-train"), *ARGS, "sweep_id=killed"],
        cwd=perception_home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest.json").exists():
            assert proc.poll() is None, "run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        time.sleep(0.5)  # well into the next epoch
        assert proc.poll() is None, "run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run_dir / "done.json").exists()

    resumed = cli("perception-train", *ARGS, "sweep_id=killed", home=perception_home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout

    ref_dir = perception_home / "runs" / "uninterrupted" / "shared-f0"
    assert _exact_metrics(run_dir) == _exact_metrics(ref_dir)
    a, b = final_predictions(run_dir), final_predictions(ref_dir)
    for key in a:
        assert np.array_equal(a[key], b[key]), key

    # the resumed run continued the same MLflow run, with one value per epoch
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "done.json").read_text())["run_id"]
    client = MlflowClient(f"sqlite:///{perception_home / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "val_auc_mean")
    assert sorted(m.step for m in history) == [0, 1, 2]
