"""The gate ends the sweep's parent run with the outcome, so the list of sweeps in the MLflow UI
shows it: FINISHED with the decision, or FAILED when it refused; gate_W, gate_p and the workflow's
page on it. A sweep continued later is RUNNING again. The report shows the arms' GPU utilisation
where the runs logged enough samples of it, and says so where they did not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from perception.paths import MLFLOW_EXPERIMENT
from perception.tracking import ensure_parent_run
from perception.testing.sweep_store import SweepSpec, build_sweep

BASE = [0.6] * 5
URL = "https://argo.example.com/workflows/perception/ab-sweep-x7k2p"


def gate(*args: str, home, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PERCEPTION_HOME": str(home), **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(["perception-gate", *args], capture_output=True, text=True, env=full, timeout=300)


def test_the_gate_ends_the_parent_run_with_its_decision_or_refusal(mlflow_server, perception_home):
    client = MlflowClient(mlflow_server)
    if client.get_experiment_by_name(MLFLOW_EXPERIMENT) is None:
        client.create_experiment(MLFLOW_EXPERIMENT)
    decided = build_sweep(client, "parent-ship", SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]))
    refused = build_sweep(client, "parent-refused", SweepSpec(mu_a=BASE, mu_b=BASE, skip={("shared", 0)}))
    parents = {}
    for sweep_id in ("parent-ship", "parent-refused"):
        parents[sweep_id] = ensure_parent_run(sweep_id, mlflow_server)  # a continued sweep: RUNNING again
        assert client.get_run(parents[sweep_id]).info.status == "RUNNING"
    assert decided and refused
    for (variant, fold), run_id in decided.items():  # as MLflow's system metrics would log them
        # per_horizon: 12 samples a run; shared: 3, too few for a median that says anything
        util = [0.0, 50.0, 60.0] if variant == "shared" else [0.0, 80.0, 90.0, 95.0] * 3
        client.log_batch(
            run_id, metrics=[Metric("system/gpu_0_utilization_percentage", u, 0, i) for i, u in enumerate(util)]
        )

    r = gate(
        "--sweep-id",
        "parent-ship",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        home=perception_home,
        env={"PERCEPTION_WORKFLOW_URL": URL},
    )
    assert r.returncode == 0, r.stderr
    run = client.get_run(parents["parent-ship"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["decision"] == "ship_per_horizon" and run.data.tags["workflow_url"] == URL
    assert run.data.metrics["gate_W"] > 0.024 and 0 <= run.data.metrics["gate_p"] < 0.05
    report = perception_home / "gate" / "parent-ship"
    assert (
        "| GPU utilisation % (median of system metrics, median over runs) | too few samples (at most 3 a run, "
        "10 needed) | 85 | |"
    ) in (report / "report.md").read_text()
    runs = json.loads((report / "report.json").read_text())["runs"]
    assert runs["shared/f0"]["gpu_utilization"] == 50.0 and runs["shared/f0"]["gpu_samples"] == 3
    assert runs["per_horizon/f0"]["gpu_utilization"] == 85.0 and runs["per_horizon/f0"]["gpu_samples"] == 12

    r = gate(
        "--sweep-id",
        "parent-refused",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--workflow-url",
        URL,
        home=perception_home,
    )
    assert r.returncode == 3, r.stderr
    run = client.get_run(parents["parent-refused"])
    assert run.info.status == "FAILED" and run.data.tags["decision"] == "refused"
    assert run.data.tags["workflow_url"] == URL and "gate_W" not in run.data.metrics


def test_sweeps_started_side_by_side_on_a_new_store_all_get_their_parent_run(tmp_path):
    """Several processes open one new sqlite store at once (calibration sweeps side by side on one
    PERCEPTION_HOME): the store is created once, and every sweep gets its parent run."""
    env = {**os.environ, "PERCEPTION_HOME": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    code = "import sys; from perception.tracking import ensure_parent_run; print(ensure_parent_run(sys.argv[1]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"side-{k}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for k, (out, _) in enumerate(outs):
        assert client.get_run(out.strip().splitlines()[-1]).data.tags["sweep_id"] == f"side-{k}"
