"""The gate lists every training run it ignores because it is still RUNNING (training now, or left so
by a process that died): in report.json, in the notes, and on perception-gate's stderr."""

from __future__ import annotations

import json

from perception.gate.cli import main as gate_main
from perception.gate.run import run_gate
from perception.testing.sweep_store import SweepSpec, build_sweep

BASE = [0.6] * 5  # separation per ci horizon


def _running_ids(client, sweep_id: str) -> list[str]:
    exp = client.get_experiment_by_name("perception-ab")
    runs = client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and attributes.status = 'RUNNING'")
    return [r.info.run_id for r in runs if r.data.tags.get("role") == "train"]


def test_a_decision_lists_the_running_run_it_ignored(gate_store, tmp_path):
    uri, client = gate_store
    build_sweep(client, "running-listed", SweepSpec(mu_a=BASE, mu_b=BASE, duplicate=("shared", 0)))
    [running] = _running_ids(client, "running-listed")
    outcome = run_gate("running-listed", tracking_uri=uri, config_name="ci", out_dir=tmp_path, progress=False)
    assert not outcome.refused
    [line] = outcome.summary["running_ignored"]
    assert line.startswith("shared fold 0: run " + running) and "RUNNING since" in line
    assert json.loads((tmp_path / "report.json").read_text())["running_ignored"] == [line]
    assert running in (tmp_path / "report.md").read_text()


def test_a_refusal_lists_it_too_and_the_cli_prints_it(gate_store, tmp_path, capsys):
    uri, client = gate_store
    spec = SweepSpec(mu_a=BASE, mu_b=BASE, duplicate=("per_horizon", 1), skip={("shared", 2)})
    build_sweep(client, "running-refused", spec)
    [running] = _running_ids(client, "running-refused")
    code = gate_main(
        [
            "--sweep-id",
            "running-refused",
            "--tracking-uri",
            uri,
            "--config",
            "ci",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 3
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["refused"] and [running in line for line in report["running_ignored"]] == [True]
    assert f"ignored, still RUNNING: per_horizon fold 1: run {running}" in capsys.readouterr().err
