"""One trainer per run, with real `perception-train` processes: a second one exits 2 naming the
holder and touches nothing; a trainer killed -9 is taken over by the next start, which resumes; a crash
in the checkpoint write ends the MLflow run FAILED and loses nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from perception.locks import RUN_LOCK, read_holder
from perception.tracking import RunLedger
from tests.train.helpers import cli

# Full ci epochs (every training window), so the first trainer is still training when the second starts.
ARGS = [
    "experiment=ci",
    "trainer.epochs=3",
    "trainer.max_train_batches=null",
    "trainer.num_threads=1",
    "tracking.system_metrics=false",
]


def start_trainer(home: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PERCEPTION_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [shutil.which("perception-train"), *args],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, f"trainer ended before {path.name} appeared: " + proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no {path} within {limit_s:.0f} s"
        time.sleep(0.05)


def train_runs(uri: str, sweep_id: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("perception-ab")
    return c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = 'train'")


@pytest.mark.slow(seconds=80)
def test_a_second_trainer_of_a_run_exits_2_naming_the_holder_and_touches_nothing(perception_home, mlflow_server):
    sweep_id = f"twice-{uuid.uuid4().hex[:8]}"
    args = [*ARGS, f"sweep_id={sweep_id}", f"tracking.uri={mlflow_server}"]
    run_dir = perception_home / "runs" / sweep_id / "shared-f0"
    first = start_trainer(perception_home, *args)
    try:
        wait_for(run_dir / "mlflow_run.json", first)  # its MLflow run exists: the second must not touch it
        second = cli("perception-train", *args, home=perception_home)
        assert first.poll() is None, "the first trainer ended before the second one started"
    finally:
        out, err = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr[-3000:]
    message = second.stderr
    assert f"run shared-f0 of sweep {sweep_id} is in use by pid {first.pid} on host " in message
    assert "perception-train" in message and " UTC (" in message and str(run_dir / RUN_LOCK) in message

    assert first.returncode == 0, err[-3000:]
    [run] = train_runs(mlflow_server, sweep_id)
    assert run.info.status == "FINISHED"
    ops = [e["op"] for e in RunLedger(run_dir, "").entries()]
    assert ops.count("start") == 1 and "status" not in ops  # the second wrote no ledger entry
    assert (run_dir / "train.log").read_text().count("---- ") == 1  # nor opened the run's log
    assert not (run_dir / RUN_LOCK).exists()


@pytest.mark.slow(seconds=95)
def test_a_trainer_killed_9_is_taken_over_by_the_next_start_which_resumes(perception_home, mlflow_server):
    sweep_id = f"kill9-{uuid.uuid4().hex[:8]}"
    args = [*ARGS, f"sweep_id={sweep_id}", f"tracking.uri={mlflow_server}"]
    run_dir = perception_home / "runs" / sweep_id / "shared-f0"
    first = start_trainer(perception_home, *args)
    try:
        wait_for(run_dir / "checkpoints" / "latest.json", first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    assert read_holder(run_dir / RUN_LOCK).pid == first.pid  # a kill -9 leaves its lock behind

    again = cli("perception-train", *args, home=perception_home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        f"taking over the lock of run shared-f0 of sweep {sweep_id} from pid {first.pid}" in again.stderr
        and "that process no longer runs" in again.stderr
    )
    assert "resuming shared-f0 at epoch" in again.stdout
    [run] = train_runs(mlflow_server, sweep_id)  # the same MLflow run, continued
    assert run.info.status == "FINISHED"
    assert json.loads((run_dir / "done.json").read_text())["run_id"] == run.info.run_id
    assert not (run_dir / RUN_LOCK).exists()


@pytest.mark.slow(seconds=70)
def test_a_crash_in_the_checkpoint_write_ends_the_run_failed_and_loses_nothing(perception_home, mlflow_server):
    sweep_id = f"ckpt-crash-{uuid.uuid4().hex[:8]}"
    args = [
        "experiment=ci",
        "trainer.epochs=2",
        "tracking.system_metrics=false",
        f"sweep_id={sweep_id}",
        f"tracking.uri={mlflow_server}",
    ]
    run_dir = perception_home / "runs" / sweep_id / "shared-f0"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("not a directory")  # the first checkpoint write fails

    crashed = cli("perception-train", *args, home=perception_home)
    assert crashed.returncode == 1, crashed.stderr[-3000:]
    assert "NotADirectoryError" in crashed.stderr and "save_checkpoint" in crashed.stderr
    [run] = train_runs(mlflow_server, sweep_id)
    assert run.info.status == "FAILED" and run.info.end_time
    assert "val_auc_mean" in run.data.metrics  # the epoch's metrics went to the ledger before the write
    assert not (run_dir / RUN_LOCK).exists() and not (run_dir / "done.json").exists()

    (run_dir / "checkpoints").unlink()
    again = cli("perception-train", *args, home=perception_home)
    assert again.returncode == 0, again.stderr[-3000:]
    [run_after] = train_runs(mlflow_server, sweep_id)
    assert run_after.info.run_id == run.info.run_id and run_after.info.status == "FINISHED"
    history = MlflowClient(mlflow_server).get_metric_history(run.info.run_id, "val_auc_mean")
    assert sorted(m.step for m in history) == [0, 1]  # epoch 0 once, though it was trained twice


def test_a_sigterm_while_a_runs_end_is_recorded_waits_for_that_end():
    from perception.train.run_record import sigterm_deferred

    events: list[str] = []

    def terminated(signum, frame):
        events.append("terminated")
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                events.append("end recorded")
        assert events == ["end recorded", "terminated"]
    finally:
        signal.signal(signal.SIGTERM, previous)
