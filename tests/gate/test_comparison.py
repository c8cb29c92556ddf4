"""The sweep's parent run carries the per-fold comparison: per horizon A, B and B − A per fold and their
mean (the deciding horizons first), and auc_by_horizon.png."""

from __future__ import annotations

import json

import pytest

from perception.gate.run import run_gate
from perception.testing.sweep_store import SweepSpec, build_sweep


def test_the_parent_run_carries_a_table_per_horizon_and_the_plot(gate_store, tmp_path):
    uri, client = gate_store
    build_sweep(client, "compare", SweepSpec(mu_a=[0.6] * 5, mu_b=[0.6, 0.6, 0.6, 0.6, 0.8]))
    outcome = run_gate("compare", tracking_uri=uri, config_name="ci", out_dir=tmp_path / "report", progress=False)
    s = outcome.summary
    parent = client.get_run(client.get_run(s["gate_run_id"]).data.tags["mlflow.parentRunId"])
    listed = [a.path for a in client.list_artifacts(parent.info.run_id, "comparison")]
    assert listed == sorted(listed)  # the UI lists them so: the deciding horizon's table comes first
    assert listed[0] == "comparison/auc_by_horizon.png" and listed[1] == "comparison/deciding_val_auc_h40.json"
    assert set(listed[2:]) == {f"comparison/val_auc_h{h}.json" for h in (2, 5, 10, 20)}

    table = json.loads(
        open(
            client.download_artifacts(parent.info.run_id, "comparison/deciding_val_auc_h40.json", str(tmp_path))
        ).read()
    )
    assert table["columns"] == ["fold", "A shared", "B per_horizon", "B − A"]
    rows = {r[0]: r[1:] for r in table["data"]}
    assert list(rows) == ["0", "1", "2", "mean"]
    for f in range(3):
        a, b = s["auc"]["shared"]["per_fold"][f][4], s["auc"]["per_horizon"]["per_fold"][f][4]
        assert rows[str(f)] == pytest.approx([a, b, b - a], abs=1e-4)
    assert rows["mean"][2] == pytest.approx(s["delta"]["h40"], abs=1e-4)
