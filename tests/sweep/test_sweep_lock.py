"""One process per sweep, with real `perception-sweep local` processes: of two started together on one
id, one exits 2 at once naming the holder and the other trains every run once; a sweep stopped by
SIGTERM leaves no run RUNNING; one killed -9 (with its trainer) is taken over by the same command, which
resumes and finishes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from perception.locks import RUN_LOCK, SWEEP_LOCK, read_holder

CI = ["experiment=ci", "trainer.epochs=2", "tracking.system_metrics=false"]
ARMS_FOLDS = sorted((v, f) for v in ("shared", "per_horizon") for f in "012")


def start_sweep(home: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "MLFLOW_TRACKING_URI")}
    env.update(PERCEPTION_HOME=str(home), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [shutil.which("perception-sweep"), "local", *args],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def runs_of(uri: str, sweep_id: str, role: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("perception-ab")
    return c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = '{role}'")


@pytest.mark.slow(seconds=115)
def test_two_sweeps_started_together_on_one_id_one_refuses_the_other_trains_each_run_once(
    perception_home, mlflow_server
):
    sweep_id = f"twice-{uuid.uuid4().hex[:8]}"
    args = ["--sweep-id", sweep_id, *CI, f"tracking.uri={mlflow_server}"]
    a, b = start_sweep(perception_home, *args), start_sweep(perception_home, *args)
    (out_a, err_a), (out_b, err_b) = a.communicate(timeout=900), b.communicate(timeout=900)
    codes = sorted((a.returncode, b.returncode))
    assert codes[1] == 2 and codes[0] in (0, 1), (out_a + err_a)[-3000:] + (out_b + err_b)[-3000:]
    (winner, w_out, w_err), (loser, l_err) = (
        ((a, out_a, err_a), (b, err_b)) if a.returncode != 2 else ((b, out_b, err_b), (a, err_a))
    )
    assert f"sweep {sweep_id} is in use by pid {winner.pid} on host " in l_err
    assert "perception-sweep local --sweep-id " + sweep_id in l_err and " UTC (" in l_err
    assert str(perception_home / "runs" / sweep_id / SWEEP_LOCK) in l_err
    assert "training" not in l_err and "parent run" not in l_err  # refused before any work

    assert f"sweep {sweep_id}: 6/6 runs finished" in w_out, w_out + w_err[-3000:]
    assert "decision: " in w_out  # a decision, or the gate's refusal should the code change meanwhile
    train = runs_of(mlflow_server, sweep_id, "train")
    assert sorted((r.data.tags["variant"], r.data.tags["fold"]) for r in train) == ARMS_FOLDS
    assert {r.info.status for r in train} == {"FINISHED"}
    assert len(runs_of(mlflow_server, sweep_id, "gate")) == 1 and len(runs_of(mlflow_server, sweep_id, "sweep")) == 1
    assert not (perception_home / "runs" / sweep_id / SWEEP_LOCK).exists()


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no {path} within {limit_s:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow(seconds=210)
def test_a_stopped_sweep_ends_its_runs_and_one_killed_9_is_taken_over_by_the_same_command(
    perception_home, mlflow_server
):
    sweep_id = f"kill9-{uuid.uuid4().hex[:8]}"
    args = ["--sweep-id", sweep_id, *CI, "trainer.max_train_batches=null", f"tracking.uri={mlflow_server}"]
    home = perception_home / "runs" / sweep_id

    # SIGTERM to the sweep alone: its training ends KILLED, the parent run too, and no lock is left.
    first = start_sweep(perception_home, *args)
    try:
        wait_for(home / "shared-f0" / "checkpoints" / "latest.json", first)
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=300)
    assert first.returncode == 143, out + err[-3000:]
    [run] = runs_of(mlflow_server, sweep_id, "train")
    [parent] = runs_of(mlflow_server, sweep_id, "sweep")
    assert run.info.status == "KILLED" and parent.info.status == "KILLED"
    assert not (home / SWEEP_LOCK).exists() and not (home / "shared-f0" / RUN_LOCK).exists()

    # kill -9 of the sweep and its trainer, as a lost node would: their locks stay behind.
    second = start_sweep(perception_home, *args)
    try:
        wait_for(home / "per_horizon-f0" / "checkpoints" / "latest.json", second)
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.communicate(timeout=60)
    assert read_holder(home / SWEEP_LOCK).pid == second.pid and read_holder(home / "per_horizon-f0" / RUN_LOCK)

    again = start_sweep(perception_home, *args)
    out, err = again.communicate(timeout=900)
    assert f"sweep {sweep_id}: 6/6 runs finished" in out, out + err[-3000:]
    assert re.search(rf"taking over the lock of sweep {sweep_id} from pid {second.pid} .*no longer runs", err)
    assert f"taking over the lock of run per_horizon-f0 of sweep {sweep_id}" in err
    assert "per_horizon fold 0: resuming" in err and "resuming per_horizon-f0 at epoch 2" in out + err
    train = runs_of(mlflow_server, sweep_id, "train")
    assert sorted((r.data.tags["variant"], r.data.tags["fold"]) for r in train) == ARMS_FOLDS
    assert {r.info.status for r in train} == {"FINISHED"}
    assert not (home / SWEEP_LOCK).exists()
