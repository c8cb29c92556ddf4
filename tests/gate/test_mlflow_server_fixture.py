"""The shared `mlflow_server` fixture serves tracking and proxied artifacts over HTTP, on sqlite and on
a real PostgreSQL behind basic auth."""

from __future__ import annotations

from pathlib import Path

import mlflow
import psycopg2
import requests
from mlflow.tracking import MlflowClient

from tests.backends import both_backends


@both_backends()
def test_server_round_trips_a_run_with_an_artifact(mlflow_server: str, tmp_path: Path) -> None:
    assert mlflow_server.startswith("http://127.0.0.1:")
    client = MlflowClient(tracking_uri=mlflow_server)
    exp_id = client.create_experiment(f"fixture-check-{tmp_path.name}")
    run = client.create_run(exp_id, tags={"role": "probe"})
    client.log_metric(run.info.run_id, "m", 0.5, step=3)
    src = tmp_path / "a.txt"
    src.write_text("hello")
    client.log_artifact(run.info.run_id, str(src), artifact_path="dir")
    client.set_terminated(run.info.run_id)

    got = client.get_run(run.info.run_id)
    assert got.data.tags["role"] == "probe" and got.data.metrics["m"] == 0.5
    assert got.info.status == "FINISHED"
    local = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="dir/a.txt", dst_path=str(tmp_path / "dl"), tracking_uri=mlflow_server
    )
    assert Path(local).read_text() == "hello"


def test_the_postgresql_server_keeps_runs_in_postgresql_and_asks_for_a_login(
    postgresql_mlflow_server, tmp_path: Path
) -> None:
    server = postgresql_mlflow_server
    assert requests.get(f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10).status_code == 401
    auth = ("perception", server.password)
    created = requests.post(
        f"{server.uri}/api/2.0/mlflow/experiments/create", json={"name": f"pg-{tmp_path.name}"}, auth=auth, timeout=10
    )
    assert created.status_code == 200, created.text
    with psycopg2.connect(server.backend_store_uri.replace("+psycopg2", "")) as conn, conn.cursor() as cur:
        cur.execute("SELECT name FROM experiments WHERE experiment_id = %s", (int(created.json()["experiment_id"]),))
        assert cur.fetchone() == (f"pg-{tmp_path.name}",)
