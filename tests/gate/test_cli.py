"""`perception-gate` as installed, in a subprocess, against a real `mlflow server`."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from perception.gate.config import GateConfig, available_configs, conf_path
from perception.paths import MLFLOW_EXPERIMENT
from perception.testing.sweep_store import SweepSpec, build_sweep

BASE = [0.6] * 5


def gate_cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PERCEPTION_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(["perception-gate", *args], capture_output=True, text=True, env=env, timeout=300)


def ensure_experiment(client: MlflowClient) -> None:
    """The session's server may have it already; artifacts are proxied by the server."""
    if client.get_experiment_by_name(MLFLOW_EXPERIMENT) is None:
        client.create_experiment(MLFLOW_EXPERIMENT)


def test_cli_decides_refuses_and_rejects_bad_usage_against_a_server(mlflow_server, tmp_path, perception_home):
    client = MlflowClient(tracking_uri=mlflow_server)
    ensure_experiment(client)
    build_sweep(client, "cli-ship", SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]))
    build_sweep(client, "cli-missing", SweepSpec(mu_a=BASE, mu_b=BASE, skip={("shared", 0)}))

    # a decision: exit 0, one JSON line on stdout, the decision file, the report under PERCEPTION_HOME
    done = gate_cli(
        "--sweep-id",
        "cli-ship",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--decision-file",
        str(tmp_path / "decision.txt"),
        home=perception_home,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    out = json.loads(line)
    assert out["decision"] == "ship_per_horizon" and out["W"] > 0.024 and 0 <= out["p"] < 0.05
    assert (tmp_path / "decision.txt").read_text().strip() == "ship_per_horizon"
    report = perception_home / "gate" / "cli-ship"
    assert {p.name for p in report.iterdir()} >= {"report.json", "report.md", "auc_by_horizon.png"}
    logged = {a.path for a in client.list_artifacts(out["gate_run_id"], "gate")}
    assert "gate/report.md" in logged and "gate/auc_by_horizon.png" in logged

    # a refusal: exit 3 naming the missing run
    done = gate_cli(
        "--sweep-id",
        "cli-missing",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--out",
        str(tmp_path / "refused"),
        home=perception_home,
    )
    assert done.returncode == 3, done.stderr
    out = json.loads(done.stdout)
    assert out["refused"] and out["decision"] is None
    assert out["reasons"] == ["shared fold 0: no FINISHED run"]
    assert "refused: shared fold 0: no FINISHED run" in done.stderr

    # usage errors: exit 2 with the offending value named
    done = gate_cli("--sweep-id", "cli-ship", "--tracking-uri", mlflow_server, "--config", "nope", home=perception_home)
    assert done.returncode == 2 and "gate config 'nope' not found" in done.stderr and "ci" in done.stderr
    done = gate_cli("--sweep-id", "cli-ship", "--tracking-uri", mlflow_server, home=perception_home)  # default: h6000
    assert done.returncode == 2 and "horizon(s) [6000]" in done.stderr
    done = gate_cli(home=perception_home)
    assert done.returncode == 2 and "--sweep-id" in done.stderr


def test_the_mlflow_experiment_is_named_by_mlflow_experiment_and_still_by_its_old_spelling(
    mlflow_server, tmp_path, perception_home
):
    client = MlflowClient(tracking_uri=mlflow_server)
    ensure_experiment(client)
    experiment = f"gate-named-{uuid.uuid4().hex[:8]}"
    client.create_experiment(experiment)
    build_sweep(client, "cli-named", SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]), experiment=experiment)
    common = ("--sweep-id", "cli-named", "--tracking-uri", mlflow_server, "--config", "ci")

    done = gate_cli(*common, "--mlflow-experiment", experiment, "--out", str(tmp_path / "new"), home=perception_home)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] == "ship_per_horizon" and "deprecated" not in done.stderr

    # the old spelling: the same decision, and a notice on stderr naming the option that replaces it
    done = gate_cli(*common, "--experiment", experiment, "--out", str(tmp_path / "old"), home=perception_home)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] == "ship_per_horizon"
    assert (
        f"perception-gate: --experiment is deprecated here (it names the MLflow experiment); "
        f"use --mlflow-experiment {experiment}" in done.stderr
    )

    # neither: the default experiment, which holds no such sweep
    done = gate_cli(*common, "--out", str(tmp_path / "default"), home=perception_home)
    assert done.returncode == 3 and json.loads(done.stdout)["refused"], done.stderr

    shown = gate_cli("--help", home=perception_home).stdout
    assert "--mlflow-experiment NAME" in shown and " --experiment" not in shown  # the old spelling is hidden


def test_gate_values_are_overridden_on_the_command_line(mlflow_server, tmp_path, perception_home):
    client = MlflowClient(tracking_uri=mlflow_server)
    ensure_experiment(client)
    build_sweep(client, "cli-override", SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]))

    # the lift lives at h40 only: weighting h20 instead leaves nothing to ship
    done = gate_cli(
        "--sweep-id",
        "cli-override",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--out",
        str(tmp_path / "r"),
        "gate.weights={20: 1.0}",
        "gate.alpha=0.01",
        home=perception_home,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] != "ship_per_horizon"
    config = json.loads((tmp_path / "r" / "report.json").read_text())["config"]
    assert config["weights"] == {"h20": 1.0} and config["alpha"] == 0.01 and config["shift_horizons"] == [2, 5]

    done = gate_cli(
        "--sweep-id",
        "cli-override",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "gate.alpah=0.01",
        home=perception_home,
    )
    assert done.returncode == 2 and "alpah" in done.stderr
    done = gate_cli(
        "--sweep-id",
        "cli-override",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "alpha=0.01",
        home=perception_home,
    )
    assert done.returncode == 2 and "expected gate.KEY=VALUE" in done.stderr


def test_shipped_gate_configs_are_deltas_over_the_defaults():
    defaults = vars(GateConfig())
    for name in available_configs():
        written = OmegaConf.to_container(OmegaConf.load(conf_path(name)))
        for key, value in written.items():
            assert value != defaults[key], f"conf/gate/{name}.yaml repeats the default {key}: {value}"


def test_a_sweep_id_longer_than_an_argo_label_is_a_usage_error(tmp_path):
    """The gate accepts the ids the sweep accepts, and no others: at most 63 characters (the id is an Argo
    label value); it says so before it reads anything."""
    done = gate_cli(
        "--sweep-id", "s" * 64, "--config", "ci", "--tracking-uri", str(tmp_path / "no-store"), home=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"perception-gate: error: argument --sweep-id: '{'s' * 64}'" in done.stderr
        and "at most 63 characters" in done.stderr
    )
    assert done.stdout == "" and not (tmp_path / "no-store").exists()
