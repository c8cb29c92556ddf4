"""With the tracking server unreachable a run keeps training, keeps every operation in its run
directory, says what it could not send, and loses nothing once the server is back."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from perception.tracking import kept_operations, replay_unsent
from tests.backends import both_backends
from perception.testing.mlflow_server import free_port
from tests.train.helpers import cli

FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}


@both_backends(45)
def test_outage_then_replay(perception_home, mlflow_server):
    dead = f"http://127.0.0.1:{free_port()}"
    res = cli(
        "perception-train",
        "experiment=ci",
        "sweep_id=outage",
        f"tracking.uri={dead}",
        home=perception_home,
        env=FAST_FAIL,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "unreachable" in res.stdout and "perception-sweep sync --sweep-id outage" in res.stdout
    run_dir = perception_home / "runs" / "outage" / "shared-f0"
    done = json.loads((run_dir / "done.json").read_text())
    assert done["run_id"] is None and done["unsent"] > 0
    ops = [json.loads(line)["op"] for line in (run_dir / "tracking.jsonl").read_text().splitlines()]
    assert ops[0] == "start" and ops.count("metrics") == 2 and ops[-2:] == ["end", "settle_parent"]

    still_dead = cli(
        "perception-sweep", "sync", "--sweep-id", "outage", "--tracking-uri", dead, home=perception_home, env=FAST_FAIL
    )
    assert still_dead.returncode == 1, still_dead.stderr[-3000:]
    assert "sweep outage: 1 run(s) could not be brought up to date (0 operation(s) sent)" in still_dead.stderr
    assert "shared-f0: " in still_dead.stderr and "perception-sweep sync --sweep-id outage` again" in still_dead.stderr
    assert kept_operations("outage", perception_home) == {"shared-f0": len(ops)}  # nothing sent, nothing lost

    sent = replay_unsent("outage", perception_home, mlflow_server)
    assert sent == len(ops)
    client = MlflowClient(mlflow_server)
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sweep_id"] == "outage"
    assert client.get_run(run.data.tags["mlflow.parentRunId"]).info.status == "FINISHED"  # made, then settled
    assert [m.step for m in client.get_metric_history(run_id, "val_auc_mean")] == [0, 1]
    paths = {a.path for a in client.list_artifacts(run_id, "predictions")}
    assert "predictions/val_final.npz" in paths
    assert replay_unsent("outage", perception_home, mlflow_server) == 0  # nothing twice
