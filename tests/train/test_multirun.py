"""Hydra multirun runs the whole A/B for those who prefer it, and the gate decides on it."""

from __future__ import annotations

import json

import pytest

from tests.train.helpers import cli


@pytest.mark.slow(seconds=90)
def test_multirun_then_gate(perception_home):
    res = cli(
        "perception-train",
        "-m",
        "experiment=ci",
        "trainer.epochs=1",
        "sweep_id=multirun",
        "model.attention_pool=shared,per_horizon",
        "data.fold=0,1,2",
        home=perception_home,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = perception_home / "runs" / "multirun"
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        f"{v}-f{f}" for v in ("shared", "per_horizon") for f in range(3)
    )
    assert all((p / "done.json").exists() for p in runs.iterdir())
    parents = _parents(perception_home, "multirun")  # made by the first job, settled by each: not RUNNING
    assert [p.info.status for p in parents] == ["FINISHED"], parents

    gate = cli(
        "perception-gate",
        "--sweep-id",
        "multirun",
        "--config",
        "ci",
        "--out",
        str(perception_home / "gate"),
        home=perception_home,
    )
    assert gate.returncode == 0, gate.stderr[-3000:]
    decision = json.loads(gate.stdout.strip().splitlines()[-1])
    assert decision["decision"] in ("ship_per_horizon", "keep_shared", "inconclusive")
    assert (perception_home / "gate" / "report.md").exists()


def _parents(home, sweep_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("perception-ab")
    return client.search_runs(
        [exp.experiment_id], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.role = 'sweep'"
    )
