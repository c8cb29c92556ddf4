"""The shared `mlflow_server` fixture serves tracking and proxied artifacts over HTTP."""

from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient


def test_server_round_trips_a_run_with_an_artifact(mlflow_server: str, tmp_path: Path) -> None:
    assert mlflow_server.startswith("http://127.0.0.1:")
    client = MlflowClient(tracking_uri=mlflow_server)
    exp_id = client.create_experiment("fixture-check")
    run = client.create_run(exp_id, tags={"role": "probe"})
    client.log_metric(run.info.run_id, "m", 0.5, step=3)
    src = tmp_path / "a.txt"
    src.write_text("hello")
    client.log_artifact(run.info.run_id, str(src), artifact_path="dir")
    client.set_terminated(run.info.run_id)

    got = client.get_run(run.info.run_id)
    assert got.data.tags["role"] == "probe" and got.data.metrics["m"] == 0.5
    assert got.info.status == "FINISHED"
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="dir/a.txt",
                                                dst_path=str(tmp_path / "dl"), tracking_uri=mlflow_server)
    assert Path(local).read_text() == "hello"
