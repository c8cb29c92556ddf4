"""`perception-sweep ui` as installed: the URLs it prints open the MLflow UI (HTTP 200) on a shared view
whose filter selects exactly the sweep's training runs, grouped and with the columns that compare folds;
on a local store it starts the UI itself and stops it on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from mlflow.tracking import MlflowClient

from perception.testing.sweep_store import SweepSpec, build_sweep, new_store
from tests.backends import both_backends
from perception.testing.mlflow_server import free_port

URL_LINE = re.compile(r"^grouped by (variant|fold)\b.*?(http\S+)$", re.M)
SPEC = SweepSpec(mu_a=[0.6] * 5, mu_b=[0.6, 0.6, 0.6, 0.6, 0.7], n_windows=200)


def ui(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["perception-sweep", "ui", *args], capture_output=True, text=True, timeout=120, env=env)


def training_run_ids(client: MlflowClient, experiment_id: str, sweep_id: str) -> set[str]:
    runs = client.search_runs([experiment_id], filter_string=f"tags.sweep_id = '{sweep_id}'")
    return {r.info.run_id for r in runs if r.data.tags.get("role") == "train"}


def shared_view(client: MlflowClient, url: str) -> tuple[str, dict]:
    """(experiment id, the view's state) that a printed URL opens."""
    fragment = urlsplit(url).fragment  # /experiments/<id>/runs?viewStateShareKey=…
    path, _, query = fragment.partition("?")
    experiment_id = re.fullmatch(r"/experiments/(\d+)/runs", path).group(1)
    params = parse_qs(query)
    assert set(params) == {"viewStateShareKey", "workflowType"}  # a search parameter would void the view
    tags = client.get_experiment(experiment_id).tags
    envelope = json.loads(tags["mlflow.sharedViewState." + params["viewStateShareKey"][0]])
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    return experiment_id, json.loads(envelope["state"])


def check_view(client: MlflowClient, url: str, grouping: str, sweep_id: str, base: str) -> None:
    login = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    page = requests.get(url, timeout=30, auth=login if all(login) else None)  # as a signed-in browser
    assert page.status_code == 200 and '<div id="root"' in page.text, page.text[:300]
    assert url.startswith(base + "/#/")
    experiment_id, state = shared_view(client, url)
    found = {r.info.run_id for r in client.search_runs([experiment_id], filter_string=state["searchFilter"])}
    assert found == training_run_ids(client, experiment_id, sweep_id) and len(found) == 6
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": grouping}]
    for column in ("tags.`variant`", "tags.`fold`", "metrics.`val_auc_h2`", "metrics.`val_auc_h40`"):
        assert column in state["selectedColumns"]


@both_backends(100)
def test_ui_points_at_a_tracking_server_with_the_sweep_s_runs_view(mlflow_server, tmp_path):
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = f"ui-{uuid.uuid4().hex[:8]}"
    client.create_experiment(experiment)
    build_sweep(client, "ui-older", SPEC, experiment=experiment)
    build_sweep(client, "ui-latest", SPEC, experiment=experiment)
    env = {**os.environ, "PERCEPTION_HOME": str(tmp_path / "home")}

    r = ui("--tracking-uri", mlflow_server, "--mlflow-experiment", experiment, env=env)  # the latest sweep by default
    assert r.returncode == 0, r.stderr
    urls = dict(URL_LINE.findall(r.stdout))
    assert set(urls) == {"variant", "fold"} and "sweep ui-latest" in r.stdout
    for grouping, url in urls.items():
        check_view(client, url, grouping, "ui-latest", mlflow_server)
    assert "filter: tags.sweep_id = 'ui-latest' AND tags.role = 'train'" in r.stdout

    # the old spelling of the option still works, with a notice naming the new one
    r = ui("--tracking-uri", mlflow_server, "--experiment", experiment, "--sweep-id", "ui-older", env=env)
    assert r.returncode == 0, r.stderr
    assert (
        f"perception-sweep ui: --experiment is deprecated here (it names the MLflow experiment); "
        f"use --mlflow-experiment {experiment}" in r.stderr
    )
    check_view(client, dict(URL_LINE.findall(r.stdout))["fold"], "fold", "ui-older", mlflow_server)

    r = ui("--tracking-uri", mlflow_server, "--mlflow-experiment", experiment, "--sweep-id", "no-such-sweep", env=env)
    assert r.returncode == 2 and "--sweep-id 'no-such-sweep'" in r.stderr, r.stderr
    r = ui("--tracking-uri", mlflow_server, "--mlflow-experiment", "no-such-experiment", env=env)
    assert r.returncode == 2 and "--mlflow-experiment 'no-such-experiment': no such MLflow experiment" in r.stderr


def plan_parent(client: MlflowClient, sweep_id: str, experiment: str = "perception-ab") -> str:
    """Records the ci gate plan on the sweep's parent run, as a sweep does before training; its id."""
    from perception.gate.config import load_gate_config
    from perception.gate.study import PLAN_TAG, gate_plan

    exp_id = client.get_experiment_by_name(experiment).experiment_id
    parent = client.search_runs([exp_id], f"tags.sweep_id = '{sweep_id}' AND tags.role = 'sweep'")[0].info.run_id
    plan = gate_plan(load_gate_config("ci"), "shared", "per_horizon", ["shared", "per_horizon"], 1)
    client.set_tag(parent, PLAN_TAG, json.dumps(plan))
    return parent


def test_ui_serves_a_local_store_until_terminated(tmp_path):
    home = tmp_path / "home"
    uri, client = new_store(home)
    build_sweep(client, "ui-local", SPEC)
    parent = plan_parent(client, "ui-local")
    port = free_port()
    env = {**os.environ, "PERCEPTION_HOME": str(home), "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen(
        ["perception-sweep", "ui", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not any("Ctrl-C stops it" in line for line in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        out = "".join(lines)
        assert "Ctrl-C stops it" in out, out
        base = f"http://127.0.0.1:{port}"
        urls = dict(URL_LINE.findall(out))
        served = MlflowClient(tracking_uri=base)  # the search API of the UI the command started
        for grouping, url in urls.items():
            check_view(served, url, grouping, "ui-local", base)
        # one link first: the folds side by side, the deciding horizon's column (h40, the plan's) first
        assert re.search(r"^open first: (http\S+)$", out, re.M).group(1) == urls["fold"]
        _, state = shared_view(served, urls["fold"])
        assert state["columnOrder"][:4] == [
            "metrics.`val_auc_h40`",
            "tags.`variant`",
            "tags.`fold`",
            "tags.`replicate`",
        ]
        assert "(the deciding horizon h40 first)" in out
        assert f"and auc_by_horizon.png: {base}/#/experiments/0/runs/{parent}/artifacts" in out.replace(
            f"/experiments/{client.get_experiment_by_name('perception-ab').experiment_id}/", "/experiments/0/"
        )
        assert f"the MLflow UI serves {uri} at {base}" in out

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base}/health", timeout=5)  # the server went with it
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert (home / "mlflow-ui.log").is_file()


def test_ui_refuses_a_port_in_use(tmp_path):
    import socket

    home = tmp_path / "home"
    uri, client = new_store(home)
    build_sweep(client, "ui-port", SPEC)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = ui("--port", str(port), env={**os.environ, "PERCEPTION_HOME": str(home), "MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 2 and f"--port {port}" in r.stderr and "in use" in r.stderr, r.stderr
    assert not Path(home / "mlflow-ui.log").exists()
