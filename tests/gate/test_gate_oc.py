"""The gate's operating-characteristic worlds (perception/studies/gate_oc.py): they plant what they say, one
world goes through the installed gate, and the summary counts ships with Wilson intervals against the targets,
in the study's own `report` (studies/gate_oc.py, run as a command)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perception.studies.gate_oc as oc
from perception.gate import stats
from perception.gate.evidence import minimum_detectable

STUDY = Path(__file__).resolve().parents[2] / "studies" / "gate_oc.py"


def test_the_planted_lift_is_the_population_auc_difference():
    """Large sample (4 folds x 200,000 autocorrelated windows, no training effect): B − A is δ at the
    weighted horizon and 0 elsewhere, and A sits at BASE_AUC."""
    delta = 0.04
    cells = oc.world_cells(oc.Setting(1, 0.0, delta, 1, windows=200_000), seed=7, folds=4)
    for j, h in enumerate(oc.HORIZONS):
        diffs, base = [], []
        for f in range(4):
            a, b = cells[("shared", f, 0)], cells[("per_horizon", f, 0)]
            m = a["mask"][:, j]
            auc_a = stats.auc(a["probs"][m, j], a["labels"][m, j])
            diffs.append(stats.auc(b["probs"][m, j], b["labels"][m, j]) - auc_a)
            base.append(auc_a)
        planted = delta if h == oc.WEIGHTED else 0.0
        assert np.mean(diffs) == pytest.approx(planted, abs=0.004), h
        assert np.mean(base) == pytest.approx(oc.BASE_AUC[j], abs=0.004), h


def test_windows_are_autocorrelated_like_overlapping_windows():
    cells = oc.world_cells(oc.Setting(1, 0.0, 0.0, 1, windows=20_000), seed=3, folds=1)
    y = cells[("shared", 0, 0)]["labels"][:, -1].astype(float)  # h1000: a label spans 62 windows
    lag = lambda k: np.corrcoef(y[:-k], y[k:])[0, 1]  # noqa: E731
    assert lag(1) > 0.8 and abs(lag(200)) < 0.1


def test_worlds_are_decided_by_one_call_of_the_installed_gate(tmp_path):
    template = oc.migrated_store(tmp_path)
    rows = oc.run_worlds((oc.Setting(2, 0.005, 0.0, 2, windows=600), [0, 1], template))
    assert [r["world"] for r in rows] == [0, 1] and rows[0]["W"] != rows[1]["W"]  # each its own world
    for row in rows:
        assert row["returncode"] == 0 and row["decision"] in ("ship_per_horizon", "keep_shared", "inconclusive")
        assert row["variance"] == "windows + replicates" and row["mde_W"] > row["se_W"] > 0


def test_summary_counts_ships_with_wilson_intervals_against_the_targets(tmp_path):
    s = oc.Setting(3, 0.005, 0.0, 300)
    rows = [
        {
            "setting": s.name,
            "kind": "null",
            "replicates": 3,
            "tau": 0.005,
            "delta": 0.0,
            "windows": 2000,
            "world": i,
            "decision": "ship_per_horizon" if i < 9 else "keep_shared",
            "rule": "rule 1",
            "W": 0.001 * (i % 7 - 3),
            "se_W": 0.002,
            "df_W": 6.0,
            "mde_W": 0.02,
            "variance": "windows + replicates",
            "seconds": 1.0,
        }
        for i in range(300)
    ]
    (out,) = oc.summarize(rows)
    assert (out["n"], out["ships"], out["rate"]) == (300, 9, 0.03)
    assert out["wilson95"] == pytest.approx(oc.wilson(9, 300)) and out["met"] is True
    assert out["by_rule"] == {"rule 1": 9, "rule 2": 0}
    # the MDE column is the gate's current formula on each world's se and df, not what older rows stored
    assert out["median_mde_W"] == pytest.approx(minimum_detectable(0.002, 6.0, 0.025, 0.01))
    # the study's report writes that summary beside its plot
    (tmp_path / "gate_oc_runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [sys.executable, str(STUDY), "report"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PERCEPTION_GATE_OC_RESULTS": str(tmp_path), "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "gate_oc.json").read_text())["rows"] == json.loads(json.dumps([out]))
    assert (tmp_path / "gate_oc.png").stat().st_size > 0


def test_the_mde_plan_plants_the_median_mde_of_the_null_worlds():
    with pytest.raises(SystemExit, match="run --plan null first"):
        oc.plan("mde", None, [])
    rows = [
        {
            "setting": oc.Setting(r, tau, 0.0, 300).name,
            "kind": "null",
            "replicates": r,
            "tau": tau,
            "world": i,
            "se_W": 0.004 + 0.00001 * i,
            "df_W": None if r == 3 else 2.0 * r,
        }
        for r, tau in oc.MDE_SETTINGS
        for i in range(101)
    ]
    settings = oc.plan("mde", None, rows)
    assert [(s.replicates, s.tau, s.kind, s.n) for s in settings] == [(r, t, "mde", 300) for r, t in oc.MDE_SETTINGS]
    for s, df in zip(settings, (math.inf, 4.0, 2.0)):  # the median world's se is 0.0045
        assert s.delta == round(minimum_detectable(0.0045, df, 0.025, 0.01), 4)


def test_in_process_decisions_are_the_installed_gate_s(tmp_path):
    """The fast simulation decides a world exactly as the installed gate does (same W, se, decision)."""
    s = oc.Setting(2, 0.005, 0.0, 1, windows=600)
    (installed,) = oc.run_worlds((s, [0], oc.migrated_store(tmp_path)))
    (fast,) = oc.decide_in_process((s, [0], ""))
    for key in ("decision", "rule", "W", "G", "se_W", "df_W", "se_G", "mde_W", "mde_G", "variance"):
        assert fast[key] == (pytest.approx(installed[key]) if isinstance(installed[key], float) else installed[key]), (
            key
        )
    # and the cells' own t test (gate_oc.py cells) reads the lifts the gate's W and G are made of
    lift = np.array(oc.cell_lifts((s, [0]))[0])  # (F, R, H)
    assert lift[:, :, oc.HORIZONS.index(oc.WEIGHTED)].mean() == pytest.approx(fast["W"])
    assert lift[:, :, [oc.HORIZONS.index(10), oc.HORIZONS.index(30)]].mean() == pytest.approx(fast["G"])
