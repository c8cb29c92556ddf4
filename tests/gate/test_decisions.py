"""The gate's decisions on sweeps logged to a real local MLflow store (ci horizons [2, 5, 10, 20, 40];
conf/gate/ci.yaml: h40 weighs 1, shift horizons [2, 5])."""

from __future__ import annotations

import json
import math
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from sklearn.metrics import roc_auc_score

from perception.contract import ATTENTION
from perception.errors import ConfigError
from perception.gate import stats
from perception.gate.run import run_gate
from perception.testing.sweep_store import CI_HORIZONS, SweepSpec, build_sweep, fold_predictions

BASE = [0.6] * 5


def gate(gate_store, tmp_path: Path, sweep_id: str, spec: SweepSpec, config: str = "ci"):
    uri, client = gate_store
    chosen = build_sweep(client, sweep_id, spec)
    outcome = run_gate(
        sweep_id,
        tracking_uri=uri,
        config_name=config,
        out_dir=tmp_path / "report",
        decision_file=tmp_path / "decision",
        progress=False,
    )
    return outcome, chosen


def rule(outcome, name):
    return next(r for r in outcome.summary["rules"] if r["name"] == name)


def test_ship_by_rule_1_on_the_noise_floor_and_logged_to_mlflow(gate_store, tmp_path):
    outcome, _ = gate(gate_store, tmp_path, "ship-r1", SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]))
    assert (outcome.decision, outcome.refused, outcome.exit_code) == ("ship_per_horizon", False, 0)
    s = outcome.summary
    assert s["rule"] == "rule 1" and s["W"] >= 0.024 and rule(outcome, "rule 1")["evidence_floor"]
    assert (tmp_path / "decision").read_text().strip() == "ship_per_horizon"
    for name in ("report.json", "report.md", "auc_by_horizon.png", "attention_by_lag.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert json.loads((tmp_path / "report" / "report.json").read_text())["decision"] == "ship_per_horizon"
    md = (tmp_path / "report" / "report.md").read_text()
    assert "ship_per_horizon" in md and "| h40 | 1.0 |" in md and "per_horizon / h40" in md

    client: MlflowClient = gate_store[1]
    run = client.get_run(s["gate_run_id"])
    assert run.data.tags["role"] == "gate" and run.data.tags["decision"] == "ship_per_horizon"
    assert run.data.tags["sweep_id"] == "ship-r1" and run.data.tags["mlflow.parentRunId"]
    assert run.data.metrics["gate_W"] == pytest.approx(s["W"])
    assert run.data.metrics["gate_delta_h40"] == pytest.approx(s["delta"]["h40"])
    assert "gate_G" in run.data.metrics and "gate_p" in run.data.metrics
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "gate")}
    assert {"gate/report.md", "gate/report.json", "gate/auc_by_horizon.png"} <= logged


def test_every_report_states_its_minimum_detectable_effect(gate_store, tmp_path):
    from perception.gate.evidence import minimum_detectable

    outcome, _ = gate(gate_store, tmp_path, "mde", SweepSpec(mu_a=BASE, mu_b=BASE, replicates=2))
    s = outcome.summary
    r1, r2 = rule(outcome, "rule 1"), rule(outcome, "rule 2")
    assert s["mde"]["W"] == pytest.approx(minimum_detectable(r1["se"], r1["df"] or math.inf, 0.025, 0.01))
    assert s["mde"]["G"] == r2["mde"] and s["mde"]["W"] > r1["se"] * 2.8
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"would ship a true W of {s['mde']['W']:+.4f} or more 8 times in 10" in md
    assert f"it saw W = {s['W']:+.4f}" in md
    client: MlflowClient = gate_store[1]
    gate_run = client.get_run(s["gate_run_id"])
    assert gate_run.data.metrics["gate_mde_W"] == pytest.approx(s["mde"]["W"])
    assert gate_run.data.metrics["gate_mde_G"] == pytest.approx(s["mde"]["G"])
    parent = client.get_run(gate_run.data.tags["mlflow.parentRunId"])
    assert parent.data.metrics["gate_mde_W"] == pytest.approx(s["mde"]["W"])
    assert s["multiplicity"] == "holm(rule 1, rule 2)"


def test_replicates_do_not_count_each_replicate_s_prediction_noise_twice(gate_store, tmp_path):
    """Arms with much prediction noise of their own and no training effect: the between-replicate
    variance is all prediction noise, so the windows' part keeps only what the replicates share and
    the total is the variance of the replicate mean, not that plus the replicates' spread again."""
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=3, own_noise=1.0, n_windows=1000)
    outcome, _ = gate(gate_store, tmp_path, "no-double", spec)
    r1 = rule(outcome, "rule 1")
    naive_windows = np.mean([r["bootstrap"]["se"] ** 2 for r in outcome.summary["per_fold"] if r["horizon"] == 40])
    # the fold's replicate-mean lift: its bootstrap variance holds the replicate-specific part once
    assert r1["se_windows"] ** 2 < naive_windows / 3 * 0.8
    assert r1["se"] ** 2 == pytest.approx(r1["se_windows"] ** 2 + r1["se_training"] ** 2)


def test_ship_by_rule_1_on_the_test_when_the_lift_is_under_the_floor(gate_store, tmp_path):
    # seed 2: folds that agree; seed 0's folds differ by chance enough for the heterogeneity guard
    spec = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.66], replicates=2, seed=2)
    outcome, _ = gate(gate_store, tmp_path, "ship-r1-test", spec)
    r1 = rule(outcome, "rule 1")
    assert 0.01 <= outcome.summary["W"] < 0.024 and not r1["evidence_floor"] and not r1["fold_spread"]
    assert r1["p_bootstrap"] < r1["level"] == 0.025 and r1["evidence_test"]  # Holm: the other rule has no evidence
    assert outcome.decision == "ship_per_horizon"
    # after the first screen: the decision, the rule and the evidence that carried it, then the caveats
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    top = lines.index("## The decision in numbers")
    assert lines[top + 2].startswith("**Decision: `ship_per_horizon`**")
    assert lines[top + 4].startswith(
        "**Rule:** rule 1 (lift at the deployment horizons) fired (W >= min_lift (0.01)) on h40"
    )
    assert lines[top + 6].startswith(
        f"**Carried by the test:** p = {r1['p_bootstrap']:.4g} < its Holm level 0.025, enough on its own"
    )
    assert lines.index("## Caveats") == top + 8 < lines.index("## Why")


def test_ship_by_rule_2_a_shift_toward_short_horizons(gate_store, tmp_path):
    spec = SweepSpec(mu_a=BASE, mu_b=[0.75, 0.75, 0.6, 0.6, 0.58])
    outcome, _ = gate(gate_store, tmp_path, "ship-r2", spec)
    s = outcome.summary
    assert s["W"] < 0.01 and s["G"] > 0 and s["G"] >= max(0.0, -s["W"])
    assert s["rule"] == "rule 2" and outcome.decision == "ship_per_horizon"
    assert any("rule 1 did not fire" in r for r in outcome.reasons)


def test_rule_2_without_loss_allowance_keeps_shared_when_w_is_negative(gate_store, tmp_path):
    cfg = tmp_path / "no_loss.yaml"
    cfg.write_text("weights: {40: 1.0}\nshift_horizons: [2, 5]\nshift_allows_loss: false\n")
    spec = SweepSpec(mu_a=BASE, mu_b=[0.75, 0.75, 0.6, 0.6, 0.55])
    outcome, _ = gate(gate_store, tmp_path, "r2-no-loss", spec, config=str(cfg))
    assert outcome.summary["W"] < 0 < outcome.summary["G"]
    assert outcome.decision == "keep_shared" and outcome.summary["rule"] is None


def test_keep_shared_when_per_horizon_is_worse(gate_store, tmp_path):
    outcome, _ = gate(gate_store, tmp_path, "keep", SweepSpec(mu_a=BASE, mu_b=[0.5] * 5))
    assert outcome.summary["W"] < 0 and outcome.summary["G"] < 0
    assert (outcome.decision, outcome.exit_code) == ("keep_shared", 0)
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    top = lines.index("## The decision in numbers")
    assert lines[top + 4].startswith(
        "**Rule:** none fired (rule 1 (lift at the deployment horizons) needs W >= min_lift (0.01), saw W = "
    )
    assert lines[top + 6].startswith("**Evidence:** none is needed to keep the control")
    assert (tmp_path / "decision").read_text().strip() == "keep_shared"


def test_inconclusive_when_the_rule_fires_without_evidence(gate_store, tmp_path):
    # arms nearly independent and few windows: a small lift inside the noise
    spec = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.64], n_windows=400, own_noise=1.5, seed=0)
    outcome, _ = gate(gate_store, tmp_path, "inconclusive", spec)
    r1 = rule(outcome, "rule 1")
    assert 0.01 <= outcome.summary["W"] < 0.024, outcome.summary["W"]
    assert r1["fired"] and not r1["evidence_floor"] and r1["p_bootstrap"] >= 0.05
    assert outcome.decision == "inconclusive"
    assert any(r.startswith("no evidence for rule 1") for r in outcome.reasons)
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    lead = lines[lines.index("## The decision in numbers") + 6]
    assert lead.startswith(f"**Not carried:** neither the test (p = {r1['p_bootstrap']:.4g} >= its Holm level")


def test_autocorrelated_lift_iid_test_significant_block_bootstrap_not(gate_store, tmp_path):
    """B's advantage flips sign every 200 windows, the span of one window's dependence
    ((K + h_max) / stride = (720 + 40) / 4 = 190): 6000 windows but only ~30 independent pieces. Two
    replicates, so the window bootstrap carries the evidence (the folds repeat the same episodes)."""
    spec = SweepSpec(
        mu_a=BASE,
        mu_b=BASE,
        window=720,
        n_windows=2000,
        replicates=2,
        episodes=[[1, 1, -1, 1, -1, 1, 1, -1, 1, -1]] * 3,
        episode_effect=0.2,
    )
    outcome, _ = gate(gate_store, tmp_path, "autocorrelated", spec)
    s = outcome.summary
    assert s["block_len_windows"] == 190
    rows = [r for r in s["per_fold"] if r["horizon"] == 40]
    iid_p = stats.one_sided_p(stats.stouffer(np.array([r["delong_iid"]["z"] for r in rows])))
    assert iid_p < 0.01  # an i.i.d. test would call the lift significant ...
    assert s["p"] >= 0.05  # ... the block bootstrap does not
    assert 0.01 <= s["W"] < 0.024 and outcome.decision == "inconclusive"


def test_custom_weights_average_the_per_horizon_deltas(gate_store, tmp_path):
    cfg = tmp_path / "custom.yaml"
    cfg.write_text("weights: {5: 1.0, 40: 3.0}\nshift_horizons: [10]\nmin_lift: 0.02\n")
    spec = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.7, 0.55, 0.6, 0.72])
    outcome, _ = gate(gate_store, tmp_path, "custom-weights", spec, config=str(cfg))
    # Δ_h recomputed from the logged predictions, independently of the gate
    delta = {}
    for j, h in enumerate(CI_HORIZONS):
        per_fold = []
        for fold in range(3):
            p = fold_predictions(spec, fold)
            m = p["shared"]["mask"][:, j]
            per_fold.append(
                roc_auc_score(p["per_horizon"]["labels"][m, j], p["per_horizon"]["probs"][m, j])
                - roc_auc_score(p["shared"]["labels"][m, j], p["shared"]["probs"][m, j])
            )
        delta[h] = float(np.mean(per_fold))
    s = outcome.summary
    assert s["W"] == pytest.approx((delta[5] + 3 * delta[40]) / 4, abs=1e-9)
    assert s["G"] == pytest.approx(delta[10], abs=1e-9)
    assert s["config"]["weights"] == {"h5": 1.0, "h40": 3.0} and s["config"]["min_lift"] == 0.02
    assert rule(outcome, "rule 1")["horizons"] == [5, 40]
    assert s["W"] >= 0.02 and outcome.decision == "ship_per_horizon"


def test_config_horizon_absent_from_the_runs_is_a_usage_error(gate_store, tmp_path):
    uri, client = gate_store
    build_sweep(client, "wrong-horizons", SweepSpec(mu_a=BASE, mu_b=BASE))
    with pytest.raises(ConfigError, match=r"weights names horizon\(s\) \[6000\].*\[2, 5, 10, 20, 40\]"):
        run_gate("wrong-horizons", tracking_uri=uri, config_name="default", out_dir=tmp_path, progress=False)


def test_duplicate_runs_use_the_latest_finished_and_are_reported(gate_store, tmp_path):
    outcome, chosen = gate(gate_store, tmp_path, "duplicates", SweepSpec(mu_a=BASE, mu_b=BASE, duplicate=("shared", 0)))
    assert not outcome.refused
    assert outcome.summary["runs"]["shared/f0"]["run_id"] == chosen[("shared", 0)]
    notes = outcome.summary["notes"]
    assert any(n.startswith("duplicate runs for shared fold 0") and chosen[("shared", 0)] in n for n in notes)
    assert any("status RUNNING" in n for n in notes)
    assert math.isfinite(outcome.summary["W"])


def test_a_damaged_or_missing_attention_profile_is_a_note_and_the_gate_decides(gate_store, tmp_path):
    uri, client = gate_store
    chosen = build_sweep(client, "attention-lost", SweepSpec(mu_a=BASE, mu_b=BASE))
    damaged, lost = chosen[("per_horizon", 1)], chosen[("shared", 2)]
    whole = Path(client.download_artifacts(damaged, ATTENTION, str(tmp_path / "dl")))
    cut = tmp_path / "cut" / whole.name
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # a copy cut short
    client.log_artifact(damaged, str(cut), artifact_path=str(Path(ATTENTION).parent))
    (Path(urlparse(client.get_run(lost).info.artifact_uri).path) / ATTENTION).unlink()

    outcome = run_gate("attention-lost", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "r", progress=False)
    assert not outcome.refused and outcome.decision is not None, outcome.reasons
    notes = outcome.summary["notes"]
    left_out = "; its attention profile is left out of the report"
    assert any(
        n.startswith(
            f"per_horizon fold 1 (run {damaged}): {ATTENTION} is unreadable or lacks lag_edges/mass/query_names"
        )
        and "BadZipFile" in n
        and n.endswith(left_out)
        for n in notes
    ), notes
    assert f"shared fold 2 (run {lost}): artifact {ATTENTION} is missing{left_out}" in notes
    assert (tmp_path / "r" / "attention_by_lag.png").is_file()  # drawn from the runs that have a profile


# ---------------------------------------------------------------- attribution (three arms)

TRUNK = {"grad_norm_vsn": 0.5, "grad_norm_mamba": 0.8, "grad_norm_cfc": 0.3, "grad_norm_heads": 0.2}
SPECIALISED = {**TRUNK, "grad_norm_pool_query": 0.05, "query_divergence": 0.2}
LIFT = [0.6, 0.6, 0.6, 0.6, 0.8]


NOISY = dict(n_windows=400, own_noise=1.5)  # arms nearly independent, few windows: small lifts stay unproven


@pytest.mark.parametrize(
    "arms, noise, ship, attr_decision, verdict",
    [
        ((BASE, LIFT, BASE), {}, True, "ship_per_horizon", "per-horizon queries add lift beyond the context path"),
        (
            (BASE, LIFT, LIFT),
            {},
            True,
            "keep_shared_skip",
            "the lift is explained by feeding pooled context to the heads",
        ),
        (
            ([0.6, 0.6, 0.6, 0.6, 0.0], [0.6, 0.6, 0.6, 0.6, 0.64], BASE),
            NOISY,
            True,
            "inconclusive",
            "the data cannot tell",
        ),
    ],
    ids=["beats-both", "beats-shared-only", "cannot-tell"],
)
def test_attribution_through_the_shared_skip_control(gate_store, tmp_path, arms, noise, ship, attr_decision, verdict):
    mu_shared, mu_ph, mu_skip = arms
    spec = SweepSpec(
        mu_a=mu_shared,
        mu_b=mu_ph,
        extra_arms={"shared_skip": mu_skip},
        **noise,
        diagnostics={"per_horizon": SPECIALISED, "shared": SPECIALISED, "shared_skip": SPECIALISED},
    )
    outcome, _ = gate(gate_store, tmp_path, f"attr-{attr_decision}", spec)
    s = outcome.summary
    assert s["control"] == "shared" and s["treatment"] == "per_horizon"
    assert (outcome.decision == "ship_per_horizon") is ship
    attr = s["attribution"]
    assert attr["control"] == "shared_skip" and attr["decision"] == attr_decision and verdict in attr["verdict"]
    assert attr["mde"]["W"] > 0 and set(attr["mde"]) == {"W", "G"}  # how large a lift the attribution could see
    assert s["context_path"]["control"] == "shared" and s["context_path"]["treatment"] == "shared_skip"
    assert any(r.startswith("attribution (shared_skip -> per_horizon)") for r in outcome.reasons)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Attribution" in md and verdict in md and "shared_skip → per_horizon" in md
    run = gate_store[1].get_run(s["gate_run_id"])
    assert run.data.metrics["gate_attr_W"] == pytest.approx(attr["W"])
    assert run.data.metrics["gate_attr_ship"] == float(attr_decision == "ship_per_horizon")


def test_neither_control_is_beaten(gate_store, tmp_path):
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, extra_arms={"shared_skip": BASE})
    outcome, _ = gate(gate_store, tmp_path, "attr-neither", spec)
    assert outcome.decision == "keep_shared"
    attr = outcome.summary["attribution"]
    assert attr["decision"] == "keep_shared_skip"
    assert attr["verdict"] == "per-horizon queries add no lift beyond the context path"


def test_a_control_without_learning_signal_and_unspecialised_queries_are_flagged(gate_store, tmp_path):
    spec = SweepSpec(
        mu_a=BASE,
        mu_b=LIFT,
        diagnostics={
            "shared": {**TRUNK, "grad_norm_pool_query": 0.0, "query_divergence": 0.0},
            "per_horizon": {**TRUNK, "grad_norm_pool_query": 0.01, "query_divergence": 0.001},
        },
    )
    outcome, _ = gate(gate_store, tmp_path, "flags", spec)
    s = outcome.summary
    assert outcome.decision == "ship_per_horizon" and s["attribution"] is None
    assert any("received no learning signal" in f for f in s["flags"])
    assert any("did not specialise" in f for f in s["flags"])
    (why,) = [r for r in outcome.reasons if r.startswith("the lift cannot be attributed")]
    assert "--arms shared,per_horizon,shared_skip" in why
    # what carried the ship comes first; that it cannot be attributed is the first caveat
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.index("**Carried by") < md.index("## Caveats\n\n- the lift cannot be attributed") < md.index("## Why")
    assert s["diagnostics"]["shared"]["grad_norm_pool_query"] == 0.0


def test_runs_without_diagnostics_read_not_measured_and_are_still_gated(gate_store, tmp_path):
    outcome, _ = gate(gate_store, tmp_path, "no-diagnostics", SweepSpec(mu_a=BASE, mu_b=LIFT))
    assert not outcome.refused and outcome.summary["flags"] == []
    assert outcome.summary["diagnostics"]["shared"]["grad_norm_pool_query"] is None
    assert "not measured" in (tmp_path / "report" / "report.md").read_text()


def test_control_and_treatment_name_the_decision_words(gate_store, tmp_path):
    uri, client = gate_store
    build_sweep(client, "words", SweepSpec(mu_a=BASE, mu_b=LIFT, extra_arms={"shared_skip": LIFT}))
    outcome = run_gate(
        "words",
        tracking_uri=uri,
        config_name="ci",
        out_dir=tmp_path / "r",
        progress=False,
        control="shared",
        treatment="shared_skip",
    )
    assert outcome.decision == "ship_shared_skip" and outcome.summary["treatment"] == "shared_skip"
    outcome = run_gate(
        "words",
        tracking_uri=uri,
        config_name="ci",
        out_dir=tmp_path / "r2",
        progress=False,
        control="shared_skip",
        treatment="shared",
    )
    assert outcome.decision == "keep_shared_skip"
    with pytest.raises(ConfigError, match="not an arm"):
        run_gate("words", tracking_uri=uri, config_name="ci", progress=False, control="bogus")


# ---------------------------------------------------------------- replicates and training noise


def test_replicates_put_training_noise_into_the_evidence(gate_store, tmp_path):
    """The lift at h40 flips sign between replicates (+0.3 / -0.3 around +0.1): one replicate alone
    would look certain, the replicates show the training noise and the gate does not ship."""
    steady = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.7], replicates=3)
    outcome, _ = gate(gate_store, tmp_path, "reps-steady", steady)
    s = outcome.summary
    assert s["replicates"] == [0, 1, 2] and "3 replicates" in s["training_noise"]
    assert outcome.decision == "ship_per_horizon"
    swinging = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.7], replicates=2, replicate_effect=0.4)
    outcome, _ = gate(gate_store, tmp_path / "swing", "reps-swing", swinging)
    r1 = rule(outcome, "rule 1")
    assert r1["se_training"] > 3 * r1["se_windows"]
    assert outcome.decision != "ship_per_horizon" and not r1["evidence_floor"]
    # the training variance comes from F·(R−1) = 3 differences: the test is a t with about 3 df
    assert 3 <= r1["df"] < 3 * (1 + 1 / 9) ** 2


def test_replicate_sets_that_differ_within_a_fold_are_refused(gate_store, tmp_path):
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=2, skip_replicate=("per_horizon", 1, 1))
    outcome, _ = gate(gate_store, tmp_path, "reps-missing", spec)
    assert outcome.refused and outcome.exit_code == 3
    assert outcome.reasons == [
        "per_horizon fold 1 replicate 1: no FINISHED run; the arms' replicate sets differ in fold 1"
    ]


def test_one_replicate_uses_the_shipped_a_a_noise_that_matches_the_runs(gate_store, tmp_path, monkeypatch):
    from perception.gate import noise

    folder = tmp_path / "noise"
    folder.mkdir()
    big = (np.eye(5) * 0.03**2).tolist()  # a training sd of 0.03 per cell and horizon
    (folder / "ci.json").write_text(
        json.dumps(
            {
                "match": {"experiment": "ci", "trainer.epochs": "2"},
                "horizons": CI_HORIZONS,
                "arms": {"shared": {"cov": big, "n_cells": 30}},
                "source": "test",
            }
        )
    )
    monkeypatch.setattr(noise, "noise_dir", lambda: folder)
    spec = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.66], extra_params={"experiment": "ci"})
    outcome, _ = gate(gate_store, tmp_path / "r", "noise-match", spec)
    r1 = rule(outcome, "rule 1")
    assert "ci.json" in outcome.summary["training_noise"]
    assert r1["se_training"] == pytest.approx(0.03 / math.sqrt(3))
    assert r1["df"] >= 30 and "t with" in " ".join(outcome.reasons)  # the file's 30 cells, and more
    assert outcome.decision == "inconclusive"  # shipped without the noise (test above), not with it
    other = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.66], extra_params={"experiment": "local"})
    outcome, _ = gate(gate_store, tmp_path / "o", "noise-other", other)
    r1 = rule(outcome, "rule 1")
    assert "from the folds alone" in outcome.summary["training_noise"]
    assert "perception-sweep calibrate" in outcome.summary["training_noise"]
    assert r1["variance"] == "between folds" and r1["df"] == 2  # F − 1
    folds = [f for f in range(3)]
    lifts = np.array(
        [
            outcome.summary["auc"]["per_horizon"]["per_fold"][f][4] - outcome.summary["auc"]["shared"]["per_fold"][f][4]
            for f in folds
        ]
    )
    assert r1["se"] == pytest.approx(lifts.std(ddof=1) / math.sqrt(3))


def test_a_gate_with_other_settings_than_the_plan_is_exploratory(gate_store, tmp_path):
    from perception.gate.config import load_gate_config
    from perception.gate.study import PLAN_TAG, gate_plan

    uri, client = gate_store
    build_sweep(client, "planned", SweepSpec(mu_a=BASE, mu_b=LIFT))
    parent = client.search_runs(
        [client.get_experiment_by_name("perception-ab").experiment_id],
        "tags.sweep_id = 'planned' and tags.role = 'sweep'",
    )[0]
    plan = gate_plan(load_gate_config("ci"), "shared", "per_horizon", ["shared", "per_horizon"], 1)
    client.set_tag(parent.info.run_id, PLAN_TAG, json.dumps(plan))
    kept = run_gate("planned", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "a", progress=False)
    assert kept.summary["exploratory"] is False and kept.summary["plan"]["control"] == "shared"
    other = run_gate(
        "planned",
        tracking_uri=uri,
        config_name="ci",
        config_overrides=["gate.alpha=0.01"],
        out_dir=tmp_path / "b",
        progress=False,
    )
    assert other.summary["exploratory"] is True
    assert any("alpha" in d for d in other.summary["differs_from_plan"])
    assert client.get_run(other.summary["gate_run_id"]).data.tags["exploratory"] == "true"
    assert "exploratory" in (tmp_path / "b" / "report.md").read_text()


def test_a_reseeded_arm_may_train_from_another_seed_a_twin_may_not(gate_store, tmp_path):
    """`<arm>_reseed` is the fully reseeded A/A: its seed differs by design; any other arm's must agree."""
    uri, client = gate_store
    other_seed = {("shared_reseed", f): {"seed": 7_919_000} for f in range(3)}
    build_sweep(
        client, "reseed", SweepSpec(mu_a=BASE, mu_b=BASE, extra_arms={"shared_reseed": BASE}, param_override=other_seed)
    )
    outcome = run_gate(
        "reseed",
        tracking_uri=uri,
        config_name="ci",
        out_dir=tmp_path / "r",
        progress=False,
        control="shared",
        treatment="shared_reseed",
    )
    assert not outcome.refused and outcome.summary["treatment"] == "shared_reseed"
    twin_seed = {("shared_twin", f): {"seed": 7_919_000} for f in range(3)}
    build_sweep(
        client, "twin-seed", SweepSpec(mu_a=BASE, mu_b=BASE, extra_arms={"shared_twin": BASE}, param_override=twin_seed)
    )
    outcome = run_gate(
        "twin-seed",
        tracking_uri=uri,
        config_name="ci",
        out_dir=tmp_path / "t",
        progress=False,
        control="shared",
        treatment="shared_twin",
    )
    assert outcome.refused and any("disagree on seed" in r for r in outcome.reasons)


def test_folds_that_disagree_are_tested_by_their_own_spread(gate_store, tmp_path):
    """B's advantage is +, +, − by fold and the same in both replicates: a fold-by-arm difference that is
    neither window nor training noise. The folds' spread against se rejects, rule 1's se becomes the fold lifts'
    spread with 2 df, and the positive mean does not ship. The same mean advantage in every fold ships."""
    split = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=2, episodes=[[1], [1], [-1]], episode_effect=0.4)
    outcome, _ = gate(gate_store, tmp_path / "split", "folds-disagree", split)
    r1 = rule(outcome, "rule 1")
    assert outcome.summary["W"] > 0.024 and outcome.decision != "ship_per_horizon"
    assert r1["fold_spread"] and r1["heterogeneity_p"] < 1e-6 and r1["df"] == 2.0
    lifts = (
        np.array(outcome.summary["auc"]["per_horizon"]["per_fold"])[:, -1]
        - np.array(outcome.summary["auc"]["shared"]["per_fold"])[:, -1]
    )  # (F,) the fold lifts at h40
    assert r1["se"] == pytest.approx(lifts.std(ddof=1) / math.sqrt(3), rel=1e-6)
    md = (tmp_path / "split" / "report" / "report.md").read_text()
    assert "disagree more than their windows and trainings explain" in md

    steady = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=2, episodes=[[1], [1], [1]], episode_effect=0.4 / 3)
    outcome, _ = gate(gate_store, tmp_path / "steady", "folds-agree", steady)
    assert outcome.decision == "ship_per_horizon"
