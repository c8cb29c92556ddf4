"""A run's MLflow status says how it ended: FINISHED, FAILED when it raised, KILLED on SIGTERM, with
its system metrics, train.log and config; a resumed run is RUNNING again; the end reaches MLflow
through the ledger when the server was down at that moment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from perception.tracking import RunLedger, replay_unsent
from perception.testing.mlflow_server import free_port
from tests.train.helpers import cli

# Full ci epochs (every training window), so a signal lands inside an epoch.
ARGS = ["experiment=ci", "trainer.epochs=3", "trainer.max_train_batches=null", "trainer.num_threads=1"]
FAST = {"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}
FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}


def _terminate_mid_run(home: Path, run_dir: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    """Starts perception-train, sends SIGTERM once its first checkpoint is written, waits for it."""
    full_env = {**os.environ, "PERCEPTION_HOME": str(home), "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen(
        [shutil.which("perception-train"), *args],
        cwd=home,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest.json").exists():
            assert proc.poll() is None, "run ended before its first checkpoint: " + proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, "run finished before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ops(run_dir: Path) -> list[tuple[str, str]]:
    return [(e["op"], e.get("status", "")) for e in RunLedger(run_dir, "").entries()]


def test_sigterm_ends_the_run_killed_with_its_system_metrics_and_a_resume_finishes_it(perception_home, mlflow_server):
    run_dir = perception_home / "runs" / "term" / "shared-f0"
    args = [*ARGS, "sweep_id=term", f"tracking.uri={mlflow_server}"]
    r = _terminate_mid_run(perception_home, run_dir, *args, env=FAST)
    assert r.returncode == 143, r.stderr[-3000:]
    assert "recorded as KILLED" in r.stderr

    client = MlflowClient(mlflow_server)
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.end_time
    parent = run.data.tags["mlflow.parentRunId"]  # a standalone run's parent ends as its training did
    assert client.get_run(parent).info.status == "KILLED"
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(run_id, "config")} == {"config/config.yaml", "config/overrides.yaml"}
    [log] = [a.path for a in client.list_artifacts(run_id, "logs")]
    text = Path(client.download_artifacts(run_id, log, str(perception_home / "dl"))).read_text()
    assert "Terminated: signal 15 (SIGTERM)" in text  # the traceback is in the uploaded log
    assert "sweep_id=term" in (run_dir / "overrides.yaml").read_text()

    resumed = cli("perception-train", *args, home=perception_home, env=FAST)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ops = _ops(run_dir)
    killed = ops.index(("end", "KILLED"))
    assert ("status", "RUNNING") in ops[killed:] and ops[-2:] == [("end", "FINISHED"), ("settle_parent", "")]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and client.get_run(parent).info.status == "FINISHED"
    cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert len({m.step for m in cpu}) == len(cpu)  # the resumed run continues the steps
    assert (run_dir / "train.log").read_text().count("---- ") == 2  # both attempts, one file


def test_a_crash_ends_the_run_failed_with_its_log_and_no_system_metrics_when_off(perception_home, mlflow_server):
    r = cli(
        "perception-train",
        "experiment=ci",
        "sweep_id=crash",
        "trainer.lr=1e30",
        "tracking.system_metrics=false",
        f"tracking.uri={mlflow_server}",
        home=perception_home,
    )
    assert r.returncode == 1
    assert "training loss is nan" in r.stderr
    run_dir = perception_home / "runs" / "crash" / "shared-f0"
    client = MlflowClient(mlflow_server)
    run = client.get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "FAILED"
    assert client.get_run(run.data.tags["mlflow.parentRunId"]).info.status == "FAILED"
    assert not [k for k in run.data.metrics if k.startswith("system/")]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "logs")] == ["logs/train.log"]
    assert "FloatingPointError: training loss is nan" in (run_dir / "train.log").read_text()


def test_a_run_killed_during_an_outage_is_killed_in_mlflow_once_synced(perception_home, mlflow_server):
    run_dir = perception_home / "runs" / "term-outage" / "shared-f0"
    dead = f"http://127.0.0.1:{free_port()}"
    r = _terminate_mid_run(
        perception_home, run_dir, *ARGS, "sweep_id=term-outage", f"tracking.uri={dead}", env=FAST_FAIL
    )
    assert r.returncode == 143, r.stderr[-3000:]
    assert _ops(run_dir)[-2:] == [("end", "KILLED"), ("settle_parent", "")]

    assert replay_unsent("term-outage", perception_home, mlflow_server) > 0
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    run = MlflowClient(mlflow_server).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["sweep_id"] == "term-outage"
    assert MlflowClient(mlflow_server).get_run(run.data.tags["mlflow.parentRunId"]).info.status == "KILLED"


def test_a_status_entry_sets_an_ended_run_running_again(tmp_path, mlflow_server):
    ledger = RunLedger(tmp_path, mlflow_server)
    ledger.record("start", tags={"sweep_id": "revive", "role": "train"}, params={}, run_name="shared-f0")
    ledger.record("end", status="KILLED")
    assert ledger.flush(force=True)
    client = MlflowClient(mlflow_server)
    assert client.get_run(ledger.run_id()).info.status == "KILLED"
    ledger.record("status", status="RUNNING")
    assert ledger.flush(force=True)
    assert client.get_run(ledger.run_id()).info.status == "RUNNING"


def test_a_parent_settles_to_what_its_trainings_say(tmp_path, mlflow_server):
    """RUNNING while any training runs; then FAILED over KILLED over FINISHED."""
    from perception.tracking import ensure_parent_run, settle_parent

    client = MlflowClient(mlflow_server)
    parent = ensure_parent_run("settle", mlflow_server)
    exp = client.get_run(parent).info.experiment_id
    kids = [
        client.create_run(exp, tags={"mlflow.parentRunId": parent, "role": "train", "sweep_id": "settle"})
        for _ in range(3)
    ]
    ids = [k.info.run_id for k in kids]
    client.set_terminated(ids[0], "FINISHED")
    assert settle_parent(client, ids[0]) == "RUNNING" and client.get_run(parent).info.status == "RUNNING"
    client.set_terminated(ids[1], "KILLED")
    client.set_terminated(ids[2], "FINISHED")
    assert settle_parent(client, ids[2]) == "KILLED" and client.get_run(parent).info.status == "KILLED"
    client.set_terminated(ids[2], "FAILED")
    assert settle_parent(client, ids[2]) == "FAILED" and client.get_run(parent).info.status == "FAILED"
    client.update_run(ids[1], "RUNNING")  # resumed
    assert settle_parent(client, ids[1]) == "RUNNING" and client.get_run(parent).info.status == "RUNNING"
    for i in ids:
        client.set_terminated(i, "FINISHED")
    assert settle_parent(client, ids[0]) == "FINISHED" and client.get_run(parent).info.status == "FINISHED"
    client.delete_run(parent)  # a parent deleted from the UI: nothing to settle, nothing kept failing
    assert settle_parent(client, ids[0]) is None
