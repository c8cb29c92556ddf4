"""The validity study's counts (studies/validity.py runs the sweeps): which sweeps count as ships of their
test, and per test the ships with their Wilson 95 % interval against the target, the spread of W, and for
sequential studies where they stopped and what they trained."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from perception.contract import QUERY_DIAGNOSTICS as DIAGNOSTICS

TARGETS = {"false_ship": 0.05, "power": 0.8}
POWER_TESTS = ("per_horizon", "ab", "extremes")  # tests whose treatment is better: a ship is right
ATTRIBUTION_TESTS = ("extremes", "extremes_null")  # three-arm sweeps, counted by their attribution


def wilson(ships: int, n: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of ships / n (scipy's)."""
    if n == 0:
        return (math.nan, math.nan)
    ci = binomtest(ships, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (float(ci.low), float(ci.high))


def counts(row: dict) -> bool:
    """Whether a sweep counts as a ship of its test: its decision, or for a three-arm test its attribution
    (with, for the known yes, the decision too)."""
    if row["test"] == "extremes":
        return row["decision"] == f"ship_{row['treatment']}" and row.get("attribution") == f"ship_{row['treatment']}"
    if row["test"] == "extremes_null":
        return row.get("attribution") == f"ship_{row['treatment']}"
    return row["decision"] == f"ship_{row['treatment']}"


def summarize(runs: list[dict]) -> list[dict]:
    """One row per test, experiment, arms, replicates (or sequential design and its boundaries), training-noise
    source and evidence: the ships among its sweeps with their Wilson interval against the target, and the
    spread of W."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r.get("decision") and r["test"] != "calibrate":  # rows of an earlier calibration test
            seq = bool(r.get("max_replicates"))  # a sequential study's evidence changes form from look to look
            key = (
                r["test"],
                r["experiment"],
                r["control"],
                r["treatment"],
                0 if seq else r.get("replicates", 1),
                "" if seq else r.get("training_noise", "")[:40],
                r.get("evidence", "normal"),
                r.get("max_replicates", 0),
                r.get("boundaries", "") if seq else "",  # a sequential study's pre-registered boundaries
                r.get("seeding", "replicates"),  # "cells": each fold its own init; before, one per replicate
            )
            groups.setdefault(key, []).append(r)
    rows = []
    for (test, experiment, a, b, reps, _, evidence, max_reps, bounds, seeding), rs in sorted(groups.items()):
        reps = reps or max_reps
        ships = sum(counts(r) for r in rs)
        lo, hi = wilson(ships, len(rs))
        kind = "power" if test in POWER_TESTS else "false_ship"
        rows.append(
            {
                "test": test,
                "experiment": experiment,
                "control": a,
                "treatment": b,
                "replicates": reps,
                "evidence": evidence,
                "seeding": seeding,
                "n": len(rs),
                "ships": ships,
                "rate": ships / len(rs),
                "ci95": [lo, hi],
                "measures": kind,
                "target": TARGETS[kind],
                "by_rule": {
                    rule: sum(counts(r) and r.get("rule") == rule for r in rs) for rule in ("rule 1", "rule 2")
                },
                "decisions": {d: sum(r["decision"] == d for r in rs) for d in sorted({r["decision"] for r in rs})},
                "training_noise": rs[0].get("training_noise"),
                **(_attribution_summary(rs) if test in ATTRIBUTION_TESTS else {}),
                # the spread of W across sweeps: with R replicates, training noise enters it / R
                "W_mean": float(np.mean([r["W"] for r in rs])),
                "W_sd": float(np.std([r["W"] for r in rs], ddof=1)) if len(rs) > 1 else None,
                "median_sweep_s": float(np.median([r["seconds"] for r in rs])),
                **(_sequential_summary(rs, max_reps) if max_reps else {}),
                **({"boundaries": bounds} if bounds else {}),
            }
        )
    return rows


def _sequential_summary(rs: list[dict], max_reps: int) -> dict:
    """Where the sequential studies stopped and the trainings they used against the fixed design's."""
    looks = [r.get("look") or max_reps for r in rs]
    per_wave = [r["trainings"] / r["look"] for r in rs if r.get("trainings") and r.get("look")]
    fixed = max_reps * (per_wave[0] if per_wave else math.nan)
    used = float(np.mean([r.get("trainings") or math.nan for r in rs]))
    return {
        "design": "sequential",
        "max_replicates": max_reps,
        "stops_by_look": {str(k): looks.count(k) for k in range(1, max_reps + 1)},
        "expected_trainings": used,
        "fixed_trainings": fixed,
        "trainings_saving": 1 - used / fixed,
    }


def _attribution_summary(rs: list[dict]) -> dict:
    """What the three-arm sweeps' attributions said, their lift and power, and the per-horizon and
    shared_skip queries' diagnostics (means and medians over sweeps)."""

    def present(values):
        return [v for v in values if v is not None]

    def median(values):
        return float(np.median(present(values))) if present(values) else None

    lifts = present([r.get("attribution_W") for r in rs])
    return {
        "attributions": {
            d: sum(str(r.get("attribution")) == d for r in rs) for d in sorted({str(r.get("attribution")) for r in rs})
        },
        "verdicts": {
            v: sum(str(r.get("verdict")) == v for r in rs) for v in sorted({str(r.get("verdict")) for r in rs})
        },
        "attribution_W_mean": float(np.mean(lifts)) if lifts else None,
        "attribution_W_sd": float(np.std(lifts, ddof=1)) if len(lifts) > 1 else None,
        "attribution_mde_W_median": median([r.get("attribution_mde_W") for r in rs]),
        "diagnostics_median": {
            arm: {k: median([((r.get("diagnostics") or {}).get(arm) or {}).get(k) for r in rs]) for k in DIAGNOSTICS}
            for arm in ("per_horizon", "shared_skip")
        },
    }


def contrast(row: dict, arrow: str = " -> ") -> str:
    """What a row's count compares: a three-arm test counts its attribution, per_horizon against shared_skip."""
    if row["test"] in ATTRIBUTION_TESTS:
        return f"shared_skip{arrow}{row['treatment']} (attribution)"
    return f"{row['control']}{arrow}{row['treatment']}"


def print_table(rows: list[dict]) -> None:
    print("| test | experiment | control -> treatment | R | evidence | n | ships | rate | Wilson 95% | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        op = "<=" if r["measures"] == "false_ship" else ">="
        reps = (
            f"seq ≤ {r['max_replicates']}" + (f" ({r['boundaries']})" if r.get("boundaries") else "")
            if r.get("design") == "sequential"
            else r["replicates"]
        )
        print(
            f"| {r['test']} | {r['experiment']} | {contrast(r)} | {reps} | {r['evidence']}"
            + (", folds seeded apart" if r.get("seeding") == "cells" else "")
            + " | "
            f"{r['n']} | {r['ships']} | {r['rate']:.3f} | [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | "
            f"{op} {r['target']} |"
        )


def plot(rows: list[dict], path: Path) -> None:
    """Ship rates with their Wilson intervals against the targets."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8.0, 1.7 * len(rows)), 4.5))
    x = np.arange(len(rows))
    rates = [r["rate"] for r in rows]
    err = [[r["rate"] - r["ci95"][0] for r in rows], [r["ci95"][1] - r["rate"] for r in rows]]
    colors = ["tab:red" if r["measures"] == "false_ship" else "tab:green" for r in rows]
    ax.bar(x, rates, color=colors, alpha=0.6)
    ax.errorbar(x, rates, yerr=err, fmt="none", color="black", capsize=4)
    ax.axhline(TARGETS["false_ship"], color="tab:red", ls="--", lw=1, label="false-ship target 0.05")
    ax.axhline(TARGETS["power"], color="tab:green", ls="--", lw=1, label="power target 0.8")
    ax.set_xticks(
        x,
        [
            f"{r['test']}\n{contrast(r, '→')}\n{r['experiment']}, {r['evidence']}, n={r['n']}"
            + (f", R={r['replicates']}" if r["replicates"] > 1 else "")
            for r in rows
        ],
        fontsize=7,
    )
    ax.set_ylabel("share of sweeps that shipped")
    ax.set_ylim(0, 1)
    ax.set_title("How often the gate ships (Wilson 95% intervals)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
