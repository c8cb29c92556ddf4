"""The MLflow server exactly as the Deployment starts it (its script, flags and env, with the
credentials from the rendered Secrets) on a real PostgreSQL (perception/testing/postgres_server.py) in place of the
`postgres` Service, only with MinIO swapped for a local directory: the flags parse, both stores open
with the driver the image installs, /health answers any Host (kubelet probes by pod IP), in-cluster
names pass the Host check and others do not, basic auth accepts the workflow's account only, and
artifacts are proxied (pods hold no S3 credentials)."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg2
import pytest
import requests

from perception.testing.postgres_server import DATABASES, USER, postgres

from .manifests import ident, prepare_tree, render

IN_CLUSTER_HOST = "mlflow.perception.svc.cluster.local:5000"
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def container_env(container: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """Kubernetes' own resolution: secretKeyRef from the Secrets, $(VAR) from earlier entries."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), item["value"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
    return env


@pytest.fixture(scope="module")
def database():
    with postgres(durable=False) as pg:
        yield pg


@pytest.fixture(scope="module")
def server(tmp_path_factory, database):
    tmp = tmp_path_factory.mktemp("mlflow-server")
    resources = {ident(r): r for r in render(prepare_tree(tmp) / "k8s" / "base")}
    secrets = {
        r["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in r["data"].items()}
        for r in resources.values()
        if r["kind"] == "Secret" and "data" in r
    }
    container = resources["Deployment/mlflow"]["spec"]["template"]["spec"]["containers"][0]
    env = container_env(container, secrets)
    db = secrets["mlflow-db"]
    assert db["POSTGRES_USER"] == USER and db["POSTGRES_DB"] in DATABASES  # the names the test cluster has
    with psycopg2.connect(database.dsn("postgres")) as conn, conn.cursor() as cur:  # the Secret's password
        cur.execute(f"ALTER ROLE {USER} PASSWORD %s", (db["POSTGRES_PASSWORD"],))
    for key in ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_DATABASE_URI"):
        assert "@postgres:5432/" in env[key], env[key]
        env[key] = env[key].replace("@postgres:5432/", f"@127.0.0.1:{database.port}/")
    port = free_port()
    artifacts = tmp / "artifacts"
    env.update(
        MLFLOW_ARTIFACTS_DESTINATION=str(artifacts),
        MLFLOW_AUTH_CONFIG_PATH=str(tmp / "basic_auth.ini"),
        HOME=str(tmp),
        PATH=os.environ["PATH"],
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    script = container["args"][0]
    assert "--host 0.0.0.0 --port 5000" in script
    script = script.replace("--host 0.0.0.0 --port 5000", f"--host 127.0.0.1 --port {port}")
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [*container["command"], script], env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited {proc.returncode}:\n{(tmp / 'server.log').read_text()[-4000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"no /health in 120 s:\n{(tmp / 'server.log').read_text()[-4000:]}")
            time.sleep(0.5)
        creds = secrets["mlflow-credentials"]
        yield {
            "url": url,
            "auth": (creds["MLFLOW_TRACKING_USERNAME"], creds["MLFLOW_TRACKING_PASSWORD"]),
            "artifacts": artifacts,
            "ini": tmp / "basic_auth.ini",
            "env": env,
            "port": port,
            "pid": proc.pid,
            "liveness": container["livenessProbe"],
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_health_answers_the_kubelet_probe(server):
    r = requests.get(f"{server['url']}/health", headers={"Host": "10.244.3.17:5000"}, timeout=10)
    assert r.status_code == 200


def liveness(server, **env) -> subprocess.CompletedProcess:
    """The Deployment's liveness probe, run as the kubelet runs it in the container (its env), at this port."""
    probe = server["liveness"]
    command = [c.replace("127.0.0.1:5000", f"127.0.0.1:{server['port']}") for c in probe["exec"]["command"]]
    return subprocess.run(
        command, env={**server["env"], **env}, capture_output=True, text=True, timeout=probe["timeoutSeconds"]
    )


def test_liveness_needs_the_store_to_answer(server):
    assert liveness(server).returncode == 0, liveness(server).stderr
    refused = liveness(server, MLFLOW_AUTH_ADMIN_PASSWORD="wrong")
    assert refused.returncode != 0 and "401" in refused.stderr
    os.killpg(server["pid"], signal.SIGSTOP)  # a server that takes connections and answers nothing
    try:
        started = time.monotonic()
        stalled = liveness(server)
        assert stalled.returncode != 0 and "timed out" in stalled.stderr, stalled.stderr[-500:]
        assert time.monotonic() - started < server["liveness"]["timeoutSeconds"]
    finally:
        os.killpg(server["pid"], signal.SIGCONT)
    assert liveness(server).returncode == 0


def test_in_cluster_name_with_credentials_is_served(server):
    r = requests.get(server["url"] + SEARCH, headers={"Host": IN_CLUSTER_HOST}, auth=server["auth"], timeout=10)
    assert r.status_code == 200, r.text


def test_requests_without_credentials_are_refused(server):
    r = requests.get(server["url"] + SEARCH, headers={"Host": IN_CLUSTER_HOST}, timeout=10)
    assert r.status_code == 401
    r = requests.get(
        server["url"] + SEARCH, headers={"Host": IN_CLUSTER_HOST}, auth=(server["auth"][0], "wrong"), timeout=10
    )
    assert r.status_code == 401


def test_foreign_host_header_is_refused(server):
    r = requests.get(
        server["url"] + SEARCH, headers={"Host": "mlflow.attacker.example:5000"}, auth=server["auth"], timeout=10
    )
    assert r.status_code in (400, 403) and "Host" in r.text


def test_auth_ini_is_private_and_holds_the_store(server):
    assert oct(server["ini"].stat().st_mode & 0o777) == "0o600"
    assert "database_uri = postgresql+psycopg2://" in server["ini"].read_text()


def test_a_pod_logs_a_run_and_an_artifact_through_the_proxy(server, tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", server["auth"][0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server["auth"][1])
    client = mlflow.MlflowClient(tracking_uri=server["url"])
    exp = client.create_experiment("perception-ab-infra-check")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "val_auc_mean", 0.5, step=0)
    report = tmp_path / "report.md"
    report.write_text("proxied")
    client.log_artifact(run.info.run_id, str(report), artifact_path="gate")
    assert client.get_experiment(exp).artifact_location.startswith("mlflow-artifacts:")
    stored = list(Path(server["artifacts"]).rglob("report.md"))
    assert len(stored) == 1 and stored[0].read_text() == "proxied"
