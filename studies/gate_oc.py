"""The decision gate's operating characteristic: how often it ships against a planted true lift.

Prediction-level worlds, each written as its own MLflow store exactly as trainings log sweeps and decided by
the installed `perception-gate --config local` in a subprocess (the real command, not its functions):
2 arms x 3 folds x R replicates at the `local` scale (horizons 10 ... 1000, window 128, stride 16), N
validation windows a fold. Labels and prediction noise are moving averages over the windows a window
shares its snapshots with, so neighbouring windows are nearly the same sample, as the product's overlapping
windows are. A cell's score is μ·y + noise of unit variance (shared by the arms and replicates of a fold,
plus each run's own), so its population AUC is Φ(μ/√2): arm A sits at BASE_AUC, arm B at BASE_AUC + δ on
the weighted horizon (h1000) and equal elsewhere, and every (arm, fold, replicate) cell is moved by a
training effect of sd τ per horizon. Every world has its own seed; nothing is reused between worlds.

    python studies/gate_oc.py run --plan null --workers 2     # δ = 0: R in {1, 2, 3} x τ in {0.005, 0.015}
    python studies/gate_oc.py run --plan power --workers 2    # δ in {0.005, 0.01, 0.02, 0.04}
    python studies/gate_oc.py run --plan mde --workers 2      # δ = the median MDE of the null worlds
    python studies/gate_oc.py report                          # table, JSON and plot from what ran
    python studies/gate_oc.py run --plan null --in-process    # the gate's functions in process: a fast
                                                                 # simulation, in gate_oc_inprocess*.{jsonl,json,png}
    python studies/gate_oc.py cells --replicates 3 --tau 0.005 --n 5000   # the cells' own t test at δ = 0

Each world's outcome is appended to studies/results/gate_oc_runs.jsonl as it ends, so a re-run resumes;
`report` writes gate_oc.json (ship rates with Wilson 95 % intervals, sd(W − δ) against the gate's se,
median minimum detectable effects) and gate_oc.png (P(ship) against δ).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from tqdm import tqdm

from perception.studies.gate_oc import (
    HORIZONS,
    MDE_BAND,
    TARGET_FALSE_SHIP,
    WEIGHTED,
    Setting,
    cell_lifts,
    decide_in_process,
    decided_rows,
    interleaved_batches,
    migrated_store,
    plan,
    run_worlds,
    summarize,
    wilson,
)

RESULTS = Path(os.environ.get("PERCEPTION_GATE_OC_RESULTS", Path(__file__).resolve().parent / "results"))
IN_PROCESS = {"on": False}  # `--in-process`: rows, summary and plot under their own names, never mixed


def runs_file() -> Path:
    return RESULTS / ("gate_oc_inprocess_runs.jsonl" if IN_PROCESS["on"] else "gate_oc_runs.jsonl")


def _out_name(ext: str) -> Path:
    return RESULTS / (f"gate_oc_inprocess.{ext}" if IN_PROCESS["on"] else f"gate_oc.{ext}")


def _read(f: Path) -> list[dict]:
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def done_rows() -> list[dict]:
    return _read(runs_file())


def all_rows() -> list[dict]:
    """Both files' worlds (installed and in process): the same worlds by name, for the mde plan's δ."""
    return _read(RESULTS / "gate_oc_runs.jsonl") + _read(RESULTS / "gate_oc_inprocess_runs.jsonl")


def run(settings: list[Setting], workers: int, budget_s: float | None, batch: int = 6) -> None:
    have = {(r["setting"], r["world"]) for r in decided_rows(done_rows())}
    left = {s.name: [i for i in range(s.n) if (s.name, i) not in have] for s in settings}
    tasks = interleaved_batches(settings, left, batch)
    todo = sum(map(len, left.values()))
    print(f"{todo} worlds to decide ({sum(s.n for s in settings) - todo} done earlier)", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s if budget_s else None
    with tempfile.TemporaryDirectory(prefix="gate-oc-template-") as tdir, open(runs_file(), "a") as out:
        template = migrated_store(Path(tdir))
        with Pool(workers) as pool:
            bar = tqdm(total=todo, desc="worlds", unit="world")
            decide_worlds = decide_in_process if IN_PROCESS["on"] else run_worlds
            for rows in pool.imap_unordered(decide_worlds, [(s, ws, template) for s, ws in tasks]):
                for row in rows:
                    out.write(json.dumps(row) + "\n")
                out.flush()
                bar.update(len(rows))
                bar.set_postfix(last=rows[-1]["decision"], s_per_world=rows[-1]["seconds"])
                if deadline is not None and time.monotonic() > deadline:
                    pool.terminate()  # what was written stays; the rest is left for the next call
                    break
            bar.close()
    report()


def report() -> list[dict]:
    """The summary of what ran: a table, the JSON and the plot."""
    out = summarize(done_rows(), all_rows())
    RESULTS.mkdir(parents=True, exist_ok=True)
    gate = (
        "the gate's functions in process (perception.gate.decision resample + decide, conf/gate/local.yaml)"
        if IN_PROCESS["on"]
        else "installed perception-gate --config local (subprocess)"
    )
    doc = {
        "what": __doc__.split("\n\n")[0],
        "gate": gate,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "node": platform.node()},
        "rows": out,
    }
    _out_name("json").write_text(json.dumps(doc, indent=2) + "\n")
    print("| kind | R | τ | δ | n | ships | rate | Wilson 95 % | sd(W−δ)/se | median MDE_W | target met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        ratio = "–" if r["sd_W_over_se"] is None else f"{r['sd_W_over_se']:.2f}"
        print(
            f"| {r['kind']} | {r['replicates']} | {r['tau']:g} | {r['delta']:g} | {r['n']} | {r['ships']} | "
            f"{r['rate']:.3f} | [{r['wilson95'][0]:.3f}, {r['wilson95'][1]:.3f}] | {ratio} | "
            f"{r['median_mde_W']:.4f} | {r.get('met', '–')} |"
        )
    _plot(out)
    return out


def cells_check(replicates: int, tau: float, n: int, workers: int) -> dict:
    """The t test on the cells alone at δ = 0, with no window bootstrap: lift / sqrt(s² / (F·R)), s² the pooled
    between-replicate variance, F·(R − 1) df. The gate's se² adds a window part ≥ 0 and Satterthwaite's df;
    at 6 df or more (R = 3) that can only make its test stricter than this one (at 3 df, R = 2, it can
    lower the bar by up to 8 %: docs/validity.md), so there this t's tail rates bound the gate's per-rule
    false rejections from above; on the worlds the gate decided too, the JSON counts how many of its
    rejections this t shares."""
    from scipy.stats import t as student_t

    s = Setting(replicates, tau, 0.0, n)  # the null plan's worlds, seed for seed
    chunks = [(s, list(range(k, min(k + 50, n)))) for k in range(0, n, 50)]
    with Pool(workers) as pool:
        lifts = np.array(
            [
                w
                for part in tqdm(pool.imap(cell_lifts, chunks), total=len(chunks), desc="cells", unit="50 worlds")
                for w in part
            ]
        )  # (n, F, R, H)
    df = 3 * (replicates - 1)
    crit = float(student_t.isf(0.025, df))
    out = {"setting": s.name, "worlds": n, "df": df, "critical_t": crit, "rules": {}}
    # the same worlds as the gate decided them, where their rows carry each rule's p
    decided = {
        r["world"]: r for r in all_rows() if r["setting"] == s.name and r.get("p_W") is not None and r["world"] < n
    }
    for name, horizons in (("W", [WEIGHTED]), ("G", [10, 30])):
        w = np.array([1.0 if h in horizons else 0.0 for h in HORIZONS]) / len(horizons)
        cell = lifts @ w  # (n, F, R)
        mean, s2 = cell.mean(axis=(1, 2)), cell.var(axis=2, ddof=1).mean(axis=1)
        t = mean / np.sqrt(s2 / (3 * replicates))
        upper = int((t > crit).sum())
        out["rules"][name] = {
            "upper_tail": upper / n,
            "upper_wilson95": wilson(upper, n),
            "lower_tail": float((t < -crit).mean()),
            "sd_lift_over_rms_se": float(mean.std(ddof=1) / math.sqrt(np.mean(s2 / (3 * replicates)))),
            "kurtosis_within": float(
                np.mean((cell - cell.mean(axis=2, keepdims=True)) ** 4)
                / np.mean((cell - cell.mean(axis=2, keepdims=True)) ** 2) ** 2
            ),
        }
        rejected = [i for i, r in decided.items() if r[f"p_{name}"] < 0.025]  # the gate's test at α/2
        out["rules"][name]["gate"] = {
            "worlds": len(decided),
            "rejected_at_alpha_2": len(rejected),
            "of_them_rejected_by_this_t": int(sum(t[i] > crit for i in rejected)),
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "gate_oc_cells.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"what": cells_check.__doc__.split("\n")[0], "rows": []}
    doc["rows"] = [r for r in doc["rows"] if r["setting"] != s.name] + [out]
    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "node": platform.node()}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    for name, r in out["rules"].items():
        g = r["gate"]
        print(
            f"{name}: P(t > t_{df}) = {r['upper_tail']:.4f} [{r['upper_wilson95'][0]:.4f}, "
            f"{r['upper_wilson95'][1]:.4f}], "
            f"P(t < -t_{df}) = {r['lower_tail']:.4f}, sd/se {r['sd_lift_over_rms_se']:.3f} (n = {n}, nominal 0.025); "
            f"the gate rejected {g['rejected_at_alpha_2']} of {g['worlds']} of these worlds, "
            f"{g['of_them_rejected_by_this_t']} of them rejected here too"
        )
    return out


def _plot(rows: list[dict]) -> None:
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    curves: dict[tuple, list[dict]] = {}
    for r in rows:
        curves.setdefault((r["replicates"], r["tau"]), []).append(r)
    for (reps, tau), rs in sorted(curves.items()):
        rs = sorted(rs, key=lambda r: r["delta"])
        x = [r["delta"] for r in rs]
        y = [r["rate"] for r in rs]
        err = [[r["rate"] - r["wilson95"][0] for r in rs], [r["wilson95"][1] - r["rate"] for r in rs]]
        line = ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=f"R = {reps}, τ = {tau:g}")
        for r in rs:
            if r["kind"] == "mde":
                ax.scatter([r["delta"]], [r["rate"]], s=90, facecolors="none", edgecolors=line[0].get_color())
    ax.axhline(TARGET_FALSE_SHIP, color="tab:red", ls="--", lw=1, label="α = 0.05")
    ax.axhspan(*MDE_BAND, color="tab:green", alpha=0.1, label="0.7–0.9 (at the reported MDE, circled)")
    ax.set_xlabel("planted true lift δ = W (AUC, h1000)")
    ax.set_ylabel("P(ship) [Wilson 95 %]")
    ax.set_ylim(0, 1.02)
    how = "the gate's functions in process" if IN_PROCESS["on"] else "installed perception-gate"
    ax.set_title(f"Decision gate: operating characteristic ({how}, local config)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(_out_name("png"), dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["run", "report", "cells"])
    p.add_argument("--plan", default="null", help="null | power | mde")
    p.add_argument("--n", type=int, default=None, help="worlds per setting (default: the plan's)")
    p.add_argument("--workers", type=int, default=2, help="worlds at once (each gate runs single-threaded)")
    p.add_argument("--budget-s", type=float, default=None, help="stop taking results after this many seconds")
    p.add_argument("--match", default="", help="only the plan's settings whose name contains this, e.g. R3-tau0.005")
    p.add_argument("--replicates", type=int, default=3, help="cells: R")
    p.add_argument("--tau", type=float, default=0.005, help="cells: τ")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="decide with the gate's functions in this process (fast simulation; its own result files)",
    )
    args = p.parse_args()
    IN_PROCESS["on"] = args.in_process
    if args.what == "report":
        report()
    elif args.what == "cells":
        cells_check(args.replicates, args.tau, args.n or 5000, args.workers)
    else:
        run([s for s in plan(args.plan, args.n, all_rows()) if args.match in s.name], args.workers, args.budget_s)


if __name__ == "__main__":
    main()
