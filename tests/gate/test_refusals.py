"""The gate refuses (exit 3) naming exactly what is wrong, and still writes and logs why."""

from __future__ import annotations

import json

import pytest

from perception.gate.run import run_gate
from perception.testing.sweep_store import SweepSpec, build_sweep

BASE = [0.6] * 5


def refused(gate_store, tmp_path, sweep_id: str, spec: SweepSpec):
    uri, client = gate_store
    chosen = build_sweep(client, sweep_id, spec)
    outcome = run_gate(
        sweep_id,
        tracking_uri=uri,
        config_name="ci",
        out_dir=tmp_path / "report",
        decision_file=tmp_path / "decision",
        progress=False,
    )
    assert (outcome.refused, outcome.decision, outcome.exit_code) == (True, None, 3)
    assert (tmp_path / "decision").read_text().strip() == "refused"
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["refused"] and report["reasons"] == outcome.reasons
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Refused" in md and all(r in md for r in outcome.reasons)
    gate_run = client.get_run(outcome.summary["gate_run_id"])
    assert gate_run.data.tags["decision"] == "refused" and gate_run.data.tags["role"] == "gate"
    assert client.get_run(gate_run.data.tags["mlflow.parentRunId"]).data.tags["role"] == "sweep"
    return outcome, chosen


def test_missing_fold(gate_store, tmp_path):
    outcome, _ = refused(
        gate_store, tmp_path, "missing-fold", SweepSpec(mu_a=BASE, mu_b=BASE, skip={("per_horizon", 2)})
    )
    assert outcome.reasons == ["per_horizon fold 2: no FINISHED run"]


def test_nan_metric(gate_store, tmp_path):
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, nan_metric=("shared", 1, 10))
    outcome, chosen = refused(gate_store, tmp_path, "nan-metric", spec)
    assert outcome.reasons == [f"shared fold 1 (run {chosen[('shared', 1)]}): metric val_auc_h10 is nan"]


def test_misaligned_predictions(gate_store, tmp_path):
    outcome, chosen = refused(gate_store, tmp_path, "misaligned", SweepSpec(mu_a=BASE, mu_b=BASE, misalign_fold=1))
    (reason,) = outcome.reasons
    assert reason.startswith(f"fold 1: predictions of shared (run {chosen[('shared', 1)]}) and per_horizon")
    assert "not aligned by index: first difference at row 0" in reason


def test_missing_predictions(gate_store, tmp_path):
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, no_predictions=("per_horizon", 0))
    outcome, chosen = refused(gate_store, tmp_path, "no-predictions", spec)
    assert outcome.reasons == [
        f"per_horizon fold 0 (run {chosen[('per_horizon', 0)]}): artifact predictions/val_final.npz is missing"
    ]


@pytest.mark.parametrize(
    "param,value",
    [
        ("data_hash", "0ther"),
        ("seed", "1"),
        ("git_sha", "fff"),
        ("trainer.epochs", "3"),
        ("data.n_folds", "4"),
        ("trainer.precision", "bf16"),
        ("model.mamba.ssd", "fla"),
        ("model.vsn.fold_embed", "True"),
        ("model.mamba.chunk", "64"),
        ("model.vsn.fused_grn", "True"),
    ],
)
def test_runs_that_disagree_are_refused(gate_store, tmp_path, param, value):
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, param_override={("per_horizon", 0): {param: value}})
    outcome, _ = refused(gate_store, tmp_path, f"mismatch-{param}", spec)
    (reason,) = outcome.reasons
    assert reason.startswith(f"runs disagree on {param}: ") and f"'{value}' in per_horizon f0" in reason


def test_runs_made_before_the_optional_fields_are_gated_beside_runs_that_log_them(gate_store, tmp_path):
    """The treatment's runs log replicate 0, trainer.precision fp32, model.mamba.ssd chunked and an unfolded,
    unfused VSN; the control's were made before those fields existed and lack them: they read as the same
    values (the contract's defaults), so the sweep is gated, not refused."""
    uri, client = gate_store
    logged = {
        "trainer.precision": "fp32",
        "model.mamba.ssd": "chunked",
        "model.vsn.fold_embed": "False",
        "model.vsn.fused_grn": "False",
    }
    chosen = build_sweep(
        client,
        "old-beside-new",
        SweepSpec(
            mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8], param_override={("per_horizon", f): logged for f in range(3)}
        ),
    )
    for (arm, _), run_id in chosen.items():
        if arm == "per_horizon":
            client.set_tag(run_id, "replicate", "0")
    outcome = run_gate("old-beside-new", tracking_uri=uri, config_name="ci", out_dir=tmp_path, progress=False)
    assert not outcome.refused, outcome.reasons
    assert outcome.decision == "ship_per_horizon" and outcome.summary["replicates"] == [0]
    assert {k: outcome.summary["params"][k] for k in logged} == logged
    assert all("ignored" not in n for n in outcome.summary["notes"])


def test_unknown_sweep_is_refused(gate_store, tmp_path):
    uri, _ = gate_store
    outcome = run_gate("no-such-sweep", tracking_uri=uri, config_name="ci", out_dir=tmp_path, progress=False)
    assert outcome.refused and outcome.exit_code == 3
    assert outcome.reasons[0].startswith("no training runs (role=train) of sweep 'no-such-sweep'")
