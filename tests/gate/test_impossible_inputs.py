"""The gate refuses (exit 3) a sweep whose logged metrics or predictions cannot be true, naming the run,
the horizon and the values: an AUC outside [0, 1], +inf (stored by MLflow as 1.8e308), a logged AUC
its run's predictions do not give, a truncated predictions file. Never a decision on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from perception.gate.inputs import AUC_TOLERANCE
from perception.gate.run import run_gate
from perception.testing.sweep_store import SweepSpec, build_sweep
from tests.gate.test_cli import ensure_experiment, gate_cli

BASE = [0.6] * 5
SHIP = [0.6, 0.6, 0.6, 0.6, 0.8]  # a sweep that, untouched, ships per_horizon
FINAL_STEP = SweepSpec(mu_a=BASE, mu_b=SHIP).epochs - 1


def overwrite_final_auc(client: MlflowClient, run_id: str, horizon: int, value: float) -> float:
    """Logs `value` at the final epoch's step, later than the trainer's: MLflow's latest value. Returns
    the value the run logged before."""
    before = client.get_run(run_id).data.metrics[f"val_auc_h{horizon}"]
    client.log_metric(run_id, f"val_auc_h{horizon}", value, step=FINAL_STEP)
    return before


def truncate_predictions(client: MlflowClient, run_id: str, tmp: Path) -> None:
    """The run's predictions/val_final.npz replaced by its first half (a copy cut short)."""
    local = Path(client.download_artifacts(run_id, "predictions/val_final.npz", str(tmp / "dl")))
    cut = tmp / "cut" / "val_final.npz"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(local.read_bytes()[: local.stat().st_size // 2])
    client.log_artifact(run_id, str(cut), artifact_path="predictions")


@pytest.mark.parametrize("case", ["above_one", "inf", "below_zero", "differs_from_predictions", "truncated"])
def test_each_impossible_input_alone_is_a_refusal(gate_store, tmp_path, case):
    uri, client = gate_store
    chosen = build_sweep(client, f"impossible-{case}", SweepSpec(mu_a=BASE, mu_b=SHIP))
    run_id = chosen[("per_horizon", 1)]
    where = f"per_horizon fold 1 (run {run_id})"
    if case == "truncated":
        truncate_predictions(client, run_id, tmp_path)
    else:
        value = {"above_one": 1.7, "inf": float("inf"), "below_zero": -0.2}.get(case)
        if value is None:  # a plausible AUC, but not the one its predictions give
            value = client.get_run(run_id).data.metrics["val_auc_h5"] + 10 * AUC_TOLERANCE
        true = overwrite_final_auc(client, run_id, 5, value)

    outcome = run_gate(
        f"impossible-{case}", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "report", progress=False
    )
    assert (outcome.refused, outcome.decision, outcome.exit_code) == (True, None, 3), outcome.reasons
    (reason,) = outcome.reasons
    assert reason.startswith(where + ": ")
    if case == "truncated":
        assert "predictions/val_final.npz is unreadable" in reason and "BadZipFile" in reason
    elif case == "differs_from_predictions":
        assert f"logged val_auc_h5 = {value:.6f} but the AUC of predictions/val_final.npz is {true:.6f}" in reason
        assert f"tolerance {AUC_TOLERANCE:g}" in reason
    elif case == "inf":
        assert "metric val_auc_h5 is 1.79769e+308, outside [0, 1] (MLflow's stored +inf)" in reason
    else:
        assert f"metric val_auc_h5 is {value:g}, outside [0, 1]" in reason
    assert json.loads((tmp_path / "report" / "report.json").read_text())["reasons"] == outcome.reasons


def test_the_installed_gate_exits_3_naming_every_impossible_input(mlflow_server, tmp_path, perception_home):
    """End to end through `perception-gate` against a real server: the same sweep that
    ships untouched is refused once an AUC reads 1.7, another +inf, another disagrees with its
    predictions and a predictions file is truncated."""
    client = MlflowClient(tracking_uri=mlflow_server)
    ensure_experiment(client)
    chosen = build_sweep(client, "cli-impossible", SweepSpec(mu_a=BASE, mu_b=SHIP))
    overwrite_final_auc(client, chosen[("shared", 0)], 2, 1.7)
    overwrite_final_auc(client, chosen[("per_horizon", 0)], 40, float("inf"))
    true = overwrite_final_auc(client, chosen[("shared", 1)], 10, 0.95)
    truncate_predictions(client, chosen[("per_horizon", 2)], tmp_path)

    done = gate_cli(
        "--sweep-id",
        "cli-impossible",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--decision-file",
        str(tmp_path / "decision"),
        home=perception_home,
    )
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    assert out["refused"] and out["decision"] is None
    assert (tmp_path / "decision").read_text().strip() == "refused"
    reasons = out["reasons"]
    assert len(reasons) == 4, reasons
    assert f"shared fold 0 (run {chosen[('shared', 0)]}): metric val_auc_h2 is 1.7, outside [0, 1]" in reasons
    assert (
        f"per_horizon fold 0 (run {chosen[('per_horizon', 0)]}): metric val_auc_h40 is 1.79769e+308, "
        f"outside [0, 1] (MLflow's stored +inf)"
    ) in reasons
    assert any(
        r.startswith(
            f"shared fold 1 (run {chosen[('shared', 1)]}): logged val_auc_h10 = 0.950000 "
            f"but the AUC of predictions/val_final.npz is {true:.6f}"
        )
        for r in reasons
    )
    assert any(
        r.startswith(f"per_horizon fold 2 (run {chosen[('per_horizon', 2)]}): predictions/val_final.npz is unreadable")
        and "BadZipFile" in r
        for r in reasons
    )
