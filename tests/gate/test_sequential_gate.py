"""perception-gate at the looks of a sequential study: waves of replicates revealed one at a time in a real
MLflow store, the design read from the parent run's gate_plan tag."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from perception.gate.config import load_gate_config
from perception.gate.run import run_gate
from perception.gate.study import PLAN_TAG, gate_plan
from perception.testing.sweep_store import SweepSpec, log_run, fold_predictions

BASE = [0.6] * 5


def start_sweep(client, sweep_id: str, replicates: int, design: str = "sequential") -> str:
    exp_id = client.get_experiment_by_name("perception-ab").experiment_id
    plan = gate_plan(load_gate_config("ci"), "shared", "per_horizon", ["shared", "per_horizon"], replicates, design)
    parent = client.create_run(
        exp_id, tags={"role": "sweep", "sweep_id": sweep_id, PLAN_TAG: json.dumps(plan)}, run_name=sweep_id
    )
    return parent.info.run_id


def log_wave(client, sweep_id: str, parent: str, spec: SweepSpec, rep: int) -> None:
    exp_id = client.get_experiment_by_name("perception-ab").experiment_id
    with tempfile.TemporaryDirectory() as tmp:
        for fold in range(3):
            for variant, pred in fold_predictions(spec, fold, rep).items():
                log_run(client, exp_id, parent, sweep_id, spec, variant, fold, pred, Path(tmp), replicate=rep)


def test_a_null_study_goes_on_then_stops_and_its_parent_closes_only_then(gate_store, tmp_path):
    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=3, seed=13)  # a null whose looks 1 and 2 cross nothing
    parent = start_sweep(client, "seq-null", 3)
    looks = []
    for rep in range(3):
        log_wave(client, "seq-null", parent, spec, rep)
        out = run_gate(
            "seq-null", tracking_uri=uri, config_name="ci", out_dir=tmp_path / f"look{rep + 1}", progress=False
        )
        assert not out.refused, out.reasons
        line = out.json_line()
        assert line["look"] == rep + 1 and line["max_looks"] == 3 and line["design"] == "sequential"
        row = out.summary["looks"][-1]
        assert row["look"] == rep + 1 and row["efficacy_alpha"] > 0
        gate_run = client.get_run(out.summary["gate_run_id"])
        assert gate_run.data.tags["look"] == str(rep + 1) and gate_run.data.tags["role"] == "gate"
        looks.append(out)
        if out.decision != "continue":
            break
        assert line["next_wave"]["replicate"] == rep + 1 and line["next_wave"]["trainings"] == 6
        still = client.get_run(parent)
        assert still.info.status == "RUNNING" and "decision" not in still.data.tags
    assert [o.decision for o in looks] == ["continue", "continue", "keep_shared"]
    last = looks[-1]
    assert "look 3 (the last): no rule fired" in last.summary["why_stopped"]
    assert last.summary["stopped_at"] == len(looks)
    ended = client.get_run(parent)
    assert ended.info.status == "FINISHED" and ended.data.tags["decision"] == last.decision
    report = (tmp_path / f"look{len(looks)}" / "report.md").read_text()
    assert "## Looks (sequential design)" in report and f"Stopped at look {len(looks)} of 3" in report
    used = last.summary["cost"]
    assert used["trainings"] == 6 * len(looks) and used["fixed_trainings"] == 18


def test_a_large_lift_ships_before_the_last_look_with_its_repeated_interval(gate_store, tmp_path):
    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=[0.6, 0.6, 0.6, 0.6, 0.9], replicates=3, seed=5)
    parent = start_sweep(client, "seq-ship", 3)
    for rep in range(2):
        log_wave(client, "seq-ship", parent, spec, rep)
        out = run_gate("seq-ship", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "r", progress=False)
        if out.decision != "continue":
            break
    assert out.decision == "ship_per_horizon" and out.summary["stopped_at"] < 3
    row = out.summary["looks"][-1]
    lo, hi = row["repeated_ci"]
    assert lo < out.summary["W"] < hi and lo > 0
    assert client.get_run(parent).data.tags["decision"] == "ship_per_horizon"


def test_a_missing_wave_and_a_bad_plan_are_refused(gate_store, tmp_path):
    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=3, seed=3)
    parent = start_sweep(client, "seq-gap", 3)
    log_wave(client, "seq-gap", parent, spec, 0)
    log_wave(client, "seq-gap", parent, spec, 2)  # wave 1 never trained
    out = run_gate("seq-gap", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "gap", progress=False)
    assert out.refused and "replicates [0, 2]: a wave is missing" in out.reasons[0]

    parent = start_sweep(client, "seq-badplan", 3)
    plan = json.loads(client.get_run(parent).data.tags[PLAN_TAG])
    plan["boundaries"]["efficacy_alpha"] = [0.04, 0.04, 0.04]
    client.set_tag(parent, PLAN_TAG, json.dumps(plan))
    log_wave(client, "seq-badplan", parent, spec, 0)
    out = run_gate("seq-badplan", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "bad", progress=False)
    assert (
        out.refused
        and "gate_plan tag" in out.reasons[0]
        and "are not the group-sequential boundaries" in out.reasons[0]
    )


def test_a_three_arm_study_runs_on_until_the_attribution_settles_too(gate_store, tmp_path):
    uri, client = gate_store
    lift = [0.6, 0.6, 0.6, 0.6, 0.9]
    spec = SweepSpec(mu_a=BASE, mu_b=lift, extra_arms={"shared_skip": lift}, replicates=3, seed=5)
    exp_id = client.get_experiment_by_name("perception-ab").experiment_id
    plan = gate_plan(
        load_gate_config("ci"), "shared", "per_horizon", ["shared", "per_horizon", "shared_skip"], 3, "sequential"
    )
    parent = client.create_run(
        exp_id, tags={"role": "sweep", "sweep_id": "seq-three", PLAN_TAG: json.dumps(plan)}
    ).info.run_id
    outs = []
    for rep in range(3):
        log_wave(client, "seq-three", parent, spec, rep)
        outs.append(
            run_gate("seq-three", tracking_uri=uri, config_name="ci", out_dir=tmp_path / str(rep + 1), progress=False)
        )
        if outs[-1].decision != "continue":
            break
    # the decision crossed its boundary at a look where the attribution did not: the study went on
    held = [k for k, out in enumerate(outs[:-1], start=1) if out.summary["looks"][k - 1]["verdict"] == "ship"]
    assert held, [out.decision for out in outs]
    assert all(outs[k - 1].decision == "continue" for k in held)
    assert "the attribution crossed no boundary" in outs[held[0] - 1].summary["why_stopped"]
    last = outs[-1]
    stopped = len(outs)
    assert last.decision == "ship_per_horizon" and last.summary["stopped_at"] == stopped
    assert last.summary["attribution"]["decision"] in ("keep_shared_skip", "inconclusive")
    assert last.summary["cost"]["trainings"] == 9 * stopped and last.summary["cost"]["fixed_trainings"] == 27
    # 9 trainings a wave on six GPUs: wave 1 also trains 3 of wave 2 (2 rounds), wave 2 the other 6 (1 round)
    rounds, ahead = {1: (2, 3), 2: (3, 0), 3: (5, 0)}[stopped]
    assert last.summary["cost"]["gpu_rounds_on_6"] == rounds and last.summary["cost"]["fixed_gpu_rounds_on_6"] == 5
    assert last.summary["cost"]["trained_ahead_on_6"] == ahead
    report = (tmp_path / str(stopped) / "report.md").read_text()
    assert "| attribution |" in report and f"attribution settled at look {stopped}" in report
    assert (tmp_path / str(held[0]) / "report.md").read_text().count(f"**Continue**: at look {held[0]} of 3") == 1


def test_the_workflows_look_reads_its_waves_only_and_refuses_a_lost_wave(gate_store, tmp_path):
    """The workflow's look k runs `perception-gate --look k --json-file F` (installed, in a subprocess): the
    waves after k (a resumed study's, half-trained before a preemption) are not read; a wave whose trainings
    all failed is refused rather than decided as the look before it, and so is a half-trained one."""
    import os
    import subprocess

    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=3, seed=13)  # look 1 crosses nothing (as above)
    parent = start_sweep(client, "seq-looks", 3)
    log_wave(client, "seq-looks", parent, spec, 0)

    def gate(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PERCEPTION_HOME": str(tmp_path / "home")}
        return subprocess.run(
            [
                "perception-gate",
                "--sweep-id",
                "seq-looks",
                "--tracking-uri",
                uri,
                "--config",
                "ci",
                "--no-progress",
                "--out",
                str(tmp_path / "report"),
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    lost = gate("--look", "2")  # wave 1's trainings all failed: none FINISHED
    assert lost.returncode == 3, lost.stderr
    assert json.loads(lost.stdout)["reasons"][0].startswith(
        "look 2 decides replicate waves 0 … 1; replicate 1 has no FINISHED run"
    )
    beyond = gate("--look", "4")
    assert beyond.returncode == 3 and "at most 3 looks" in beyond.stdout
    assert gate("--look", "0").returncode == 2

    exp_id = client.get_experiment_by_name("perception-ab").experiment_id
    with tempfile.TemporaryDirectory() as tmp:  # wave 1: one training of six finished
        pred = fold_predictions(spec, 0, 1)["shared"]
        log_run(client, exp_id, parent, "seq-looks", spec, "shared", 0, pred, Path(tmp), replicate=1)
    whole = gate()  # every wave read: the half-trained one refuses
    assert whole.returncode == 3 and "per_horizon fold 0 replicate 1: no FINISHED run" in whole.stdout
    half = gate("--look", "2")
    assert half.returncode == 3 and "per_horizon fold 0 replicate 1: no FINISHED run" in half.stdout

    done = gate("--look", "1", "--json-file", str(tmp_path / "look.json"), "--decision-file", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    line = json.loads((tmp_path / "look.json").read_text())
    assert line == json.loads(done.stdout) and line["decision"] == "continue"
    assert line["look"] == 1 and line["max_looks"] == 3 and line["W"] is not None
    assert (tmp_path / "d").read_text() == "continue\n"


def test_a_look_of_a_fixed_design_is_refused(gate_store, tmp_path):
    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, replicates=1, seed=3)
    parent = start_sweep(client, "fixed-look", 1, design="fixed")
    log_wave(client, "fixed-look", parent, spec, 0)
    out = run_gate("fixed-look", tracking_uri=uri, config_name="ci", out_dir=tmp_path, progress=False, look=1)
    assert out.refused and "pre-registered the fixed design (one look)" in out.reasons[0]
    assert not run_gate("fixed-look", tracking_uri=uri, config_name="ci", out_dir=tmp_path, progress=False).refused
