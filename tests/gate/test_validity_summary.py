"""The validity study's summary (perception/studies/validity.py; studies/validity.py's `report` writes it) of the
sweeps it ran: ships and their Wilson interval per test and
replicate count, kept apart by the gate's evidence, and the spread of W across sweeps."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import perception.studies.validity as validity

STUDY = Path(__file__).resolve().parents[2] / "studies" / "validity.py"


def row(seed: int, decision: str, W: float, replicates: int = 1, test: str = "ab", evidence: str = "t") -> dict:
    return {
        "test": test,
        "experiment": "local",
        "control": "shared",
        "treatment": "per_horizon",
        "seed": seed,
        "replicates": replicates,
        "decision": decision,
        "W": W,
        "rule": "rule 1" if decision.startswith("ship") else None,
        "seconds": 10.0,
        "evidence": evidence,
        "training_noise": f"from {replicates} replicates",
    }


def test_each_replicate_count_is_its_own_row_with_its_rate_interval_and_spread_of_W(tmp_path):
    one = [
        row(1, "ship_per_horizon", 0.05),
        row(2, "keep_shared", -0.02),
        row(3, "inconclusive", 0.01),
        row(4, "ship_per_horizon", 0.06),
    ]
    three = [row(11, "ship_per_horizon", 0.04, 3), row(12, "keep_shared", -0.01, 3)]
    stale = [row(21, "ship_per_horizon", 0.9, evidence="normal")]  # decided with the test before the t
    rows = validity.summarize(one + three + stale)
    by = {(r["replicates"], r["evidence"]): r for r in rows}
    assert set(by) == {(1, "t"), (3, "t"), (1, "normal")}
    r1, r3 = by[(1, "t")], by[(3, "t")]
    assert (r1["n"], r1["ships"], r1["rate"], r1["measures"]) == (4, 2, 0.5, "power")
    assert r1["ci95"] == pytest.approx(validity.wilson(2, 4))
    assert r1["decisions"] == {"inconclusive": 1, "keep_shared": 1, "ship_per_horizon": 2}
    assert r1["W_mean"] == pytest.approx(statistics.mean([0.05, -0.02, 0.01, 0.06]))
    assert r1["W_sd"] == pytest.approx(statistics.stdev([0.05, -0.02, 0.01, 0.06]))
    assert (r3["n"], r3["ships"]) == (2, 1) and r3["W_sd"] == pytest.approx(statistics.stdev([0.04, -0.01]))
    # the study's report writes that summary beside its plot
    (tmp_path / "validity_runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one + three + stale))
    done = subprocess.run(
        [sys.executable, str(STUDY), "report"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PERCEPTION_VALIDITY_RESULTS": str(tmp_path), "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "validity.json").read_text())["rows"] == json.loads(json.dumps(rows))
    assert (tmp_path / "validity.png").stat().st_size > 0


def test_an_aa_test_counts_its_ships_as_false_ships():
    rows = [
        row(1, "ship_shared_twin", 0.03, test="aa"),
        row(2, "keep_shared", 0.0, test="aa"),
        row(3, "inconclusive", -0.03, test="aa"),
    ]
    for r in rows:
        r["treatment"] = "shared_twin"
    (summary,) = validity.summarize(rows)
    assert (summary["measures"], summary["n"], summary["ships"], summary["target"]) == ("false_ship", 3, 1, 0.05)


def three_arm(seed: int, test: str, decision: str, attribution: str, attr_W: float) -> dict:
    r = row(seed, decision, 0.1, test=test, evidence="holm")
    verdict = (
        "per-horizon queries add lift beyond the context path"
        if attribution == "ship_per_horizon"
        else "per-horizon queries add no lift beyond the context path"
    )
    r.update(
        attribution=attribution,
        verdict=verdict,
        attribution_W=attr_W,
        attribution_mde_W=0.05,
        diagnostics={
            "per_horizon": {"query_divergence": 0.3, "attention_entropy_ratio": 0.7, "query_drift": 0.8},
            "shared_skip": {"query_divergence": 0.0, "attention_entropy_ratio": 0.6, "query_drift": 0.2},
        },
    )
    return r


def test_three_arm_tests_count_by_their_attribution():
    """The known yes counts a sweep only when it ships per_horizon and its attribution does too; its twin
    counts every attribution ship (each false), whatever the main decision."""
    power = [
        three_arm(1, "extremes", "ship_per_horizon", "ship_per_horizon", 0.08),
        three_arm(2, "extremes", "ship_per_horizon", "keep_shared_skip", 0.01),  # the context path's lift
        three_arm(3, "extremes", "inconclusive", "ship_per_horizon", 0.06),
    ]  # attribution alone: no
    twin = [
        three_arm(11, "extremes_null", "ship_per_horizon", "keep_shared_skip", -0.01),
        three_arm(12, "extremes_null", "keep_shared", "ship_per_horizon", 0.03),
    ]
    by = {r["test"]: r for r in validity.summarize(power + twin)}
    p, t = by["extremes"], by["extremes_null"]
    assert (p["measures"], p["n"], p["ships"], p["target"]) == ("power", 3, 1, 0.8)
    assert (t["measures"], t["n"], t["ships"], t["target"]) == ("false_ship", 2, 1, 0.05)
    assert p["attributions"] == {"keep_shared_skip": 1, "ship_per_horizon": 2}
    assert p["verdicts"]["per-horizon queries add lift beyond the context path"] == 2
    assert p["attribution_W_mean"] == pytest.approx(statistics.mean([0.08, 0.01, 0.06]))
    assert p["attribution_mde_W_median"] == pytest.approx(0.05)
    assert p["diagnostics_median"]["per_horizon"]["query_divergence"] == pytest.approx(0.3)
    assert t["ci95"] == pytest.approx(validity.wilson(1, 2))


def test_sequential_studies_under_other_boundaries_are_counted_apart():
    def seq(seed: int, decision: str, bounds: str) -> dict:
        return {
            **row(seed, decision, 0.01, test="aa", evidence="holm+folds"),
            "max_replicates": 2,
            "design": "sequential",
            "look": 2,
            "trainings": 12,
            "boundaries": bounds,
        }

    before = [seq(s, "keep_shared", "rho 2.5, futility p > 0.25") for s in range(4)]
    now = [seq(10, "ship_per_horizon", "rho 4, futility p > 0.35"), seq(11, "keep_shared", "rho 4, futility p > 0.35")]
    rows = validity.summarize(before + now)
    assert [(r["boundaries"], r["n"], r["ships"]) for r in rows] == [
        ("rho 2.5, futility p > 0.25", 4, 0),
        ("rho 4, futility p > 0.35", 2, 1),
    ]


def test_sweeps_whose_folds_shared_one_init_are_counted_apart(capsys):
    """Rows trained before each fold had its own init (no `seeding`) answer another question."""
    shared_init = [row(s, "ship_per_horizon", 0.02, test="aa", evidence="holm+folds") for s in range(3)]
    own_init = [{**row(s, "keep_shared", 0.0, test="aa", evidence="holm+folds"), "seeding": "cells"} for s in range(5)]
    rows = validity.summarize(shared_init + own_init)
    assert sorted((r["seeding"], r["n"], r["ships"]) for r in rows) == [("cells", 5, 0), ("replicates", 3, 3)]
    validity.print_table(rows)
    assert capsys.readouterr().out.count("folds seeded apart") == 1
