"""The sequential design's operating characteristic: worlds that reveal up to R = 3 replicates wave by wave,
decided look by look, against the fixed R = 3 design on the same worlds.

The worlds are studies/gate_oc.py's (prediction level, `local` scale, 2 arms x 3 folds, planted δ at h1000,
training effect of sd τ per cell and horizon). Each world is drawn once with three replicates; look k is decided
on replicates 0 … k−1 by the gate's own functions (perception.gate.decision.decide on that look's runs, the block
bootstrap drawn once per fold as the gate draws it: the blocks do not depend on how many replicates a look has),
then perception.gate.sequential.look_verdict applies the pre-registered boundaries, exactly as perception-gate
does at a look. Look 1's evidence comes two ways: between folds (no noise file), and from a noise file written for
the worlds from their known training noise (per-cell lift covariance 2τ²·I, 15 cells as `perception-sweep
calibrate` measures by default). The fixed design is look 3 decided with Holm at α (what perception-gate decides
for a fixed R = 3 sweep), so power and trainings are compared world by world.

    python studies/gate_oc_sequential.py run --split gcal --n 100 --workers 2  # worlds to set rho and futility
    python studies/gate_oc_sequential.py tune --split gcal                       # rho and futility, by tune's rule
    python studies/gate_oc_sequential.py run --split guard2 --workers 2          # fresh worlds, the reported ones
    python studies/gate_oc_sequential.py report --split guard2                   # table, JSON, plot
    python studies/gate_oc_sequential.py installed --n 10    # the installed perception-gate, wave by wave, on
                                                                 # the first 10 worlds of each τ = 0.005 setting

Each world's looks are appended to studies/results/gate_oc_sequential_looks.jsonl.gz as they end (a re-run
resumes; one gzip member a run, 21 MB as plain text); the decisions are recomputed from them by `report`,
so the boundaries are applied as the gate applies them now. Trainings: 6 a look (2 arms x 3 folds); wall
time in GPU rounds on six GPUs: one round a look.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import sys
import time
import zlib
from dataclasses import asdict
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from tqdm import tqdm

from perception.atomic import atomic_path
from perception.studies.gate_oc import (
    HORIZONS,
    STRIDE,
    WINDOW,
    Setting,
    gate_command,
    interleaved_batches,
    wilson,
    world_cells,
    world_seed,
)

RESULTS = Path(os.environ.get("PERCEPTION_GATE_OC_RESULTS", Path(__file__).resolve().parent / "results"))

MAX_LOOKS = 3
FOLDS, ARMS = 3, ("shared", "per_horizon")
GPUS = 6
TRAININGS_PER_LOOK = FOLDS * len(ARMS)
NOISE_CELLS = 15
LOOKS_FILE = RESULTS / "gate_oc_sequential_looks.jsonl.gz"
FIXED_MDE = {0.005: 0.0318, 0.015: 0.0387}  # the fixed R = 3 design's median MDE_W (gate_oc.json, null worlds)
TARGETS = {"false_ship": 0.05, "upper": 0.075, "power_gap": 0.05, "saving": 0.30}


# Worlds per reported setting: the targets ask for n >= 300 at δ = 0, more at τ = 0.015 where the rate sits
# nearer α; the power points are cheaper to read.
EVAL_N = {
    ("null", 0.005): 300,
    ("null", 0.015): 450,
    ("mde", 0.005): 150,
    ("2mde", 0.005): 150,
    ("mde", 0.015): 150,
    ("2mde", 0.015): 150,
    ("null-folds", 0.005): 300,
}
FOLD_SD = 0.01  # the null-folds worlds: a fold-by-arm difference of this sd per horizon, mean zero


def settings(split: str, n: int | None) -> list[Setting]:
    """Null worlds at two τ, and δ at the fixed design's MDE and twice it; `split` gives fresh seeds: `cal`
    (100 a setting) sets the boundaries' free choices, any other split is a reported one (EVAL_N)."""
    out = []
    for tau, mde in FIXED_MDE.items():
        for kind, delta in (("null", 0.0), ("mde", mde), ("2mde", 2 * mde), ("null-folds", 0.0)):
            default = EVAL_N.get((kind, tau), 0) if split != "cal" else 100
            if n or default:
                out.append(
                    Setting(
                        MAX_LOOKS,
                        tau,
                        delta,
                        n or default,
                        kind=f"seq-{split}-{kind}",
                        fold_sd=FOLD_SD if kind == "null-folds" else 0.0,
                    )
                )
    return out


# ---------------------------------------------------------------- one world, every look


def _rule_fields(r) -> dict:
    return {
        k: getattr(r, k)
        for k in (
            "name",
            "statement",
            "lift_name",
            "lift",
            "horizons",
            "weights",
            "fired",
            "p_bootstrap",
            "p_delong_thinned",
            "se",
            "se_windows",
            "se_training",
            "df",
            "variance",
        )
    }


def world_looks(task: tuple[Setting, list[int]]) -> list[dict]:
    from perception.gate import stats
    from perception.gate.config import load_gate_config
    from perception.gate.decision import decide, resample
    from perception.gate.inputs import ArmRun, Predictions, SweepInputs
    from perception.gate.noise import TrainingNoise

    s, worlds = task
    cfg = load_gate_config("local")
    rows = []
    for i in worlds:
        t0 = time.perf_counter()
        runs = {}
        for (arm, fold, rep), c in world_cells(s, world_seed(s, i)).items():
            final = np.array(
                [
                    stats.auc(c["probs"][c["mask"][:, j], j], c["labels"][c["mask"][:, j], j])
                    for j in range(len(HORIZONS))
                ]
            )  # (H,) what a training logs
            runs[(arm, fold, rep)] = ArmRun(
                f"{arm}-{fold}-{rep}",
                arm,
                fold,
                rep,
                final,
                None,
                Predictions(c["probs"], c["labels"], c["mask"], c["index"]),
                None,
                {},
            )
        full = SweepInputs(
            f"seq-{i}",
            "",
            "",
            None,
            list(HORIZONS),
            WINDOW,
            STRIDE,
            FOLDS,
            {},
            runs,
            list(ARMS),
            list(range(MAX_LOOKS)),
        )
        boot = resample(full, cfg, progress=False)
        noise = TrainingNoise(
            "worlds' known training noise",
            list(HORIZONS),
            {"shared": 2 * s.tau**2 * np.eye(len(HORIZONS))},
            {"shared": NOISE_CELLS},
        )
        looks = {}
        for k in range(1, MAX_LOOKS + 1):
            part = SweepInputs(
                full.sweep_id,
                "",
                "",
                None,
                full.horizons,
                WINDOW,
                STRIDE,
                FOLDS,
                {},
                {key: r for key, r in runs.items() if key[2] < k},
                list(ARMS),
                list(range(k)),
            )
            g = decide(part, cfg, *ARMS, boot)
            looks[str(k)] = {"W": g.W, "G": g.G, "decision": g.decision, "rules": [_rule_fields(r) for r in g.rules]}
            if k == 1:
                g = decide(part, cfg, *ARMS, boot, noise)
                looks["1n"] = {"W": g.W, "G": g.G, "decision": g.decision, "rules": [_rule_fields(r) for r in g.rules]}
        rows.append(
            {
                "setting": s.name,
                **asdict(s),
                "world": i,
                "seed": world_seed(s, i),
                "looks": looks,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    return rows


def read_looks() -> tuple[list[dict], bool]:
    """Every complete row of LOOKS_FILE, and whether it ends cut short (a run killed mid-write): the rows
    before the cut stand."""
    rows: list[dict] = []
    if not LOOKS_FILE.is_file():
        return rows, False
    try:
        with gzip.open(LOOKS_FILE, "rt") as f:
            for line in f:
                if not line.endswith("\n"):
                    return rows, True
                rows.append(json.loads(line))
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return rows, True
    return rows, False


def done_rows() -> list[dict]:
    first: dict[tuple[str, int], dict] = {}
    for r in read_looks()[0]:
        first.setdefault((r["setting"], r["world"]), r)
    return list(first.values())


def _mend_looks() -> None:
    """A member cut short would hide every member appended after it: rewrite the complete rows first."""
    rows, cut = read_looks()
    if cut:
        print(f"{LOOKS_FILE}: cut short; keeping its {len(rows)} complete rows", file=sys.stderr)
        with atomic_path(LOOKS_FILE) as tmp, gzip.open(tmp, "wt") as out:
            out.writelines(json.dumps(r) + "\n" for r in rows)


def run(todo: list[Setting], workers: int, budget_s: float | None, batch: int = 5) -> None:
    have = {(r["setting"], r["world"]) for r in done_rows()}
    left = {s.name: [i for i in range(s.n) if (s.name, i) not in have] for s in todo}
    tasks = interleaved_batches(todo, left, batch)
    total = sum(map(len, left.values()))
    print(f"{total} worlds to decide at every look", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s if budget_s else None
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    _mend_looks()
    with Pool(workers) as pool, gzip.open(LOOKS_FILE, "at") as out:
        bar = tqdm(total=total, desc="worlds", unit="world")
        for rows in pool.imap_unordered(world_looks, tasks):
            for row in rows:
                out.write(json.dumps(row) + "\n")
            out.flush()
            bar.update(len(rows))
            bar.set_postfix(s_per_world=rows[-1]["seconds"])
            if deadline is not None and time.monotonic() > deadline:
                pool.terminate()
                break
        bar.close()


# ---------------------------------------------------------------- the installed gate, wave by wave


def installed_world(s: Setting, i: int) -> dict:
    """One world revealed wave by wave to the installed `perception-gate` (a subprocess per look) in its own
    MLflow store whose parent run pre-registers the sequential plan: the decision and the look it stopped at."""
    import subprocess
    import tempfile

    from mlflow.tracking import MlflowClient

    from perception.gate.config import load_gate_config
    from perception.gate.study import PLAN_TAG, gate_plan
    from perception.testing.sweep_store import SweepSpec, log_run

    cells = world_cells(s, world_seed(s, i))
    spec = SweepSpec(
        mu_a=[0.0] * 5,
        mu_b=[0.0] * 5,
        horizons=list(HORIZONS),
        n_windows=s.windows,
        window=WINDOW,
        stride=STRIDE,
        epochs=2,
        seed=world_seed(s, i),
        replicates=MAX_LOOKS,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    with tempfile.TemporaryDirectory(prefix="gate-oc-seq-") as tmp:
        tmp = Path(tmp)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        exp = client.create_experiment("perception-ab", artifact_location=(tmp / "artifacts").as_uri())
        plan = gate_plan(load_gate_config("local"), *ARMS, list(ARMS), MAX_LOOKS, "sequential")
        parent = client.create_run(
            exp, tags={"role": "sweep", "sweep_id": f"w{i}", PLAN_TAG: json.dumps(plan)}
        ).info.run_id
        for k in range(1, MAX_LOOKS + 1):
            for (arm, fold, rep), pred in sorted(cells.items()):
                if rep == k - 1:
                    log_run(client, exp, parent, f"w{i}", spec, arm, fold, pred, tmp, replicate=rep, attention=False)
            done = subprocess.run(
                [
                    gate_command(),
                    "--sweep-id",
                    f"w{i}",
                    "--tracking-uri",
                    uri,
                    "--config",
                    "local",
                    "--out",
                    str(tmp / f"look{k}"),
                    "--no-progress",
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            line = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
            if line.get("decision") != "continue":
                return {
                    "setting": s.name,
                    "world": i,
                    "decision": line.get("decision"),
                    "look": line.get("look"),
                    "returncode": done.returncode,
                    "error": None if line else done.stderr[-800:],
                }
    return {"setting": s.name, "world": i, "decision": "continue", "look": MAX_LOOKS, "returncode": done.returncode}


def installed_check(n: int, split: str) -> dict:
    """The installed gate against the in-process decisions on the first n decided worlds of each reported
    setting at τ = 0.005 (look 1 between folds: the worlds match no shipped noise file)."""
    from perception.gate.config import load_gate_config
    from perception.gate.sequential import boundaries

    cfg = load_gate_config("local")
    b = boundaries(MAX_LOOKS, cfg.alpha)
    rows = {
        (r["setting"], r["world"]): r
        for r in done_rows()
        if r["kind"].startswith(f"seq-{split}-") and r["tau"] == 0.005
    }
    todo = [s for s in settings(split, None) if s.tau == 0.005]
    out = []
    for s in todo:
        worlds = sorted(i for (name, i) in rows if name == s.name)[:n]
        for i in tqdm(worlds, desc=f"installed gate, {s.kind}", unit="world"):
            got = installed_world(s, i)
            want = sequential_outcome(rows[(s.name, i)], b, cfg.noise_floor, "1")
            word = {"ship": "ship_per_horizon", "keep": "keep_shared", "inconclusive": "inconclusive"}[want["verdict"]]
            out.append(
                {
                    **got,
                    "in_process": word,
                    "in_process_look": want["looks"],
                    "agree": got["decision"] == word and got["look"] == want["looks"],
                }
            )
    doc = {
        "what": "the installed perception-gate, wave by wave, against the in-process decisions of the same worlds",
        "n": len(out),
        "agree": sum(r["agree"] for r in out),
        "rows": out,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "node": platform.node()},
    }
    (RESULTS / "gate_oc_sequential_installed.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"installed gate agrees with the in-process decision (and stopping look) on {doc['agree']} of {doc['n']} worlds"
    )
    return doc


# ---------------------------------------------------------------- decisions from the looks


def _rules(look: dict):
    from perception.gate.decision import RuleResult

    return [RuleResult(**r) for r in look["rules"]]


def sequential_outcome(row: dict, bounds, noise_floor: float, look1: str) -> dict:
    """The study's end for one world under `bounds`: look 1 from between folds ("1") or the noise file ("1n")."""
    from perception.gate.sequential import look_verdict, settle

    verdicts = []
    for k in range(1, bounds.max_looks + 1):
        look = row["looks"][look1 if k == 1 else str(k)]
        verdicts.append(look_verdict(*_rules(look), k, bounds, noise_floor))
        if settle(verdicts):
            break
    end = settle(verdicts)
    stop_look = row["looks"][look1 if end.look == 1 else str(end.look)]
    return {"looks": end.look, "verdict": end.verdict, "rule": end.rule, "W": stop_look["W"]}


def fixed_outcome(row: dict) -> dict:
    look = row["looks"][str(MAX_LOOKS)]
    return {"looks": MAX_LOOKS, "verdict": look["decision"].split("_")[0], "W": look["W"]}


def summarize_rows(rows: list[dict], bounds, noise_floor: float) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["tau"], r["delta"]), []).append(r)
    out = []
    for (kind, tau, delta), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        fixed = [fixed_outcome(r) for r in rs]
        f_ships = sum(o["verdict"] == "ship" for o in fixed)
        for look1 in ("1", "1n"):
            seq = [sequential_outcome(r, bounds, noise_floor, look1) for r in rs]
            ships = sum(o["verdict"] == "ship" for o in seq)
            looks = np.array([o["looks"] for o in seq])
            early = [o["W"] - delta for o in seq if o["verdict"] == "ship" and o["looks"] < MAX_LOOKS]
            row = {
                "kind": kind.split("-", 2)[2],
                "tau": tau,
                "delta": delta,
                "look1": "between folds" if look1 == "1" else "noise file",
                "n": len(rs),
                "ships": ships,
                "rate": ships / len(rs),
                "wilson95": wilson(ships, len(rs)),
                "fixed_ships": f_ships,
                "fixed_rate": f_ships / len(rs),
                "fixed_wilson95": wilson(f_ships, len(rs)),
                "stops_by_look": {str(k): int((looks == k).sum()) for k in range(1, MAX_LOOKS + 1)},
                "verdicts": {v: sum(o["verdict"] == v for o in seq) for v in ("ship", "keep", "inconclusive")},
                "expected_trainings": float(TRAININGS_PER_LOOK * looks.mean()),
                "expected_trainings_se": float(TRAININGS_PER_LOOK * looks.std(ddof=1) / math.sqrt(len(looks))),
                "fixed_trainings": TRAININGS_PER_LOOK * MAX_LOOKS,
                "expected_rounds": float(np.mean([math.ceil(TRAININGS_PER_LOOK / GPUS) * k for k in looks])),
                "fixed_rounds": math.ceil(TRAININGS_PER_LOOK * MAX_LOOKS / GPUS),
                "early_ship_W_bias": float(np.mean(early)) if early else None,
                "early_ships": len(early),
            }
            row["trainings_saving"] = 1 - row["expected_trainings"] / row["fixed_trainings"]
            out.append(row)
    return out


def _met(r: dict) -> str:
    if r["kind"] in ("null", "null-folds"):
        return str(r["rate"] <= TARGETS["false_ship"] and r["wilson95"][1] <= TARGETS["upper"] and r["n"] >= 300)
    if r["kind"] == "mde":
        ok = r["fixed_rate"] - r["rate"] <= TARGETS["power_gap"] and r["expected_trainings"] <= r["fixed_trainings"]
        return str(ok and r["expected_rounds"] <= r["fixed_rounds"])
    return str(r["trainings_saving"] >= TARGETS["saving"] and r["expected_rounds"] <= r["fixed_rounds"])


def print_table(rows: list[dict]) -> None:
    print(
        "| world | τ | δ | look 1 | n | P(ship) seq [Wilson 95 %] | fixed R=3 | stops at look 1/2/3 | "
        "E[trainings] (fixed) | saving | E[rounds] (fixed) | target met |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["stops_by_look"]
        print(
            f"| {r['kind']} | {r['tau']:g} | {r['delta']:.4f} | {r['look1']} | {r['n']} | {r['rate']:.3f} "
            f"[{r['wilson95'][0]:.3f}, {r['wilson95'][1]:.3f}] | {r['fixed_rate']:.3f} | {s['1']}/{s['2']}/{s['3']} | "
            f"{r['expected_trainings']:.1f} ± {r['expected_trainings_se']:.1f} ({r['fixed_trainings']}) | "
            f"{100 * r['trainings_saving']:.0f} % | {r['expected_rounds']:.2f} ({r['fixed_rounds']}) | {_met(r)} |"
        )


TUNE_FUTILITY = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
TUNE_RHO = (2.5, 3.0, 3.5, 4.0)
TUNE_NULL_SAVING = 0.33  # the choice's margin over the 30 % target: calibration worlds are few


def tune(split: str) -> dict | None:
    """ρ and the futility bound on the calibration worlds, by a rule fixed before they are read: among the
    grid's pairs whose trainings at δ = 0 are at least TUNE_NULL_SAVING below the fixed design's in every
    (τ, look 1) cell, the one whose largest power gap to the fixed design at the MDE is smallest (ties: the
    larger mean saving at twice the MDE); None when no pair saves enough."""
    from perception.gate.config import load_gate_config
    from perception.gate.sequential import boundaries

    cfg = load_gate_config("local")
    rows = [r for r in done_rows() if r["kind"].startswith(f"seq-{split}-")]
    found = []
    for fut in TUNE_FUTILITY:
        for rho in TUNE_RHO:
            out = summarize_rows(rows, boundaries(MAX_LOOKS, cfg.alpha, rho=rho, futility_p=fut), cfg.noise_floor)
            gap = max(r["fixed_rate"] - r["rate"] for r in out if r["kind"] == "mde")
            null_saving = min(r["trainings_saving"] for r in out if r["kind"] == "null")
            big_saving = float(np.mean([r["trainings_saving"] for r in out if r["kind"] == "2mde"]))
            ok = null_saving >= TUNE_NULL_SAVING
            found.append(
                dict(futility_p=fut, rho=rho, power_gap=gap, null_saving=null_saving, saving_2mde=big_saving, ok=ok)
            )
            print(
                f"futility p > {fut:.2f}, rho {rho:.1f}: largest power gap at the MDE {100 * gap:+.1f} points, "
                f"smallest saving at δ = 0 {100 * null_saving:.0f} %, mean saving at 2 × MDE {100 * big_saving:.0f} %"
                f"{'  (qualifies)' if ok else ''}"
            )
    chosen = min((f for f in found if f["ok"]), key=lambda f: (f["power_gap"], -f["saving_2mde"]), default=None)
    print(f"chosen: {chosen}" if chosen else "no pair saves enough at δ = 0")
    return chosen


def report(split: str) -> list[dict]:
    from perception.gate.config import load_gate_config
    from perception.gate.sequential import boundaries

    cfg = load_gate_config("local")
    rows = [r for r in done_rows() if r["kind"].startswith(f"seq-{split}-")]
    b = boundaries(MAX_LOOKS, cfg.alpha)
    out = summarize_rows(rows, b, cfg.noise_floor)
    for r in out:
        r["target_met"] = _met(r) == "True"
    doc = {
        "what": __doc__.split("\n\n")[0],
        "split": split,
        "boundaries": b.to_json(),
        "noise_floor": cfg.noise_floor,
        "gate": "the gate's functions in process (perception.gate.decision.decide per look, "
        "perception.gate.sequential.look_verdict), conf/gate/local.yaml",
        "median_world_s": float(np.median([r["seconds"] for r in rows])) if rows else None,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "node": platform.node()},
        "rows": out,
    }
    (RESULTS / "gate_oc_sequential.json").write_text(json.dumps(doc, indent=2) + "\n")
    print_table(out)
    _plot(out)
    return out


def _plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for (tau, look1), marker in zip(
        [(t, look1) for t in FIXED_MDE for look1 in ("between folds", "noise file")], "osD^"
    ):
        rs = sorted(
            [r for r in rows if r["tau"] == tau and r["look1"] == look1 and r["kind"] != "null-folds"],
            key=lambda r: r["delta"],
        )
        if not rs:
            continue
        x = [r["delta"] for r in rs]
        err = [[r["rate"] - r["wilson95"][0] for r in rs], [r["wilson95"][1] - r["rate"] for r in rs]]
        ax1.errorbar(
            x,
            [r["rate"] for r in rs],
            yerr=err,
            fmt=marker + "-",
            capsize=3,
            label=f"sequential, τ = {tau:g}, look 1 {look1}",
        )
        ax2.plot(
            x, [r["expected_trainings"] for r in rs], marker + "-", label=f"sequential, τ = {tau:g}, look 1 {look1}"
        )
    for tau in FIXED_MDE:
        rs = sorted(
            [r for r in rows if r["tau"] == tau and r["look1"] == "between folds" and r["kind"] != "null-folds"],
            key=lambda r: r["delta"],
        )
        if rs:
            ax1.plot([r["delta"] for r in rs], [r["fixed_rate"] for r in rs], "k--", lw=1, alpha=0.6)
    ax1.axhline(TARGETS["false_ship"], color="tab:red", ls=":", lw=1, label="α = 0.05")
    ax1.set_xlabel("planted true lift δ = W (AUC, h1000)")
    ax1.set_ylabel("P(ship) [Wilson 95 %]; dashed: fixed R = 3")
    ax1.set_ylim(0, 1.02)
    ax1.legend(fontsize=7)
    ax2.axhline(TRAININGS_PER_LOOK * MAX_LOOKS, color="k", ls="--", lw=1, label="fixed R = 3")
    ax2.axhline(0.7 * TRAININGS_PER_LOOK * MAX_LOOKS, color="tab:green", ls=":", lw=1, label="30 % below fixed")
    ax2.set_xlabel("planted true lift δ")
    ax2.set_ylabel("expected trainings (one GPU round = 6)")
    ax2.legend(fontsize=7)
    fig.suptitle("Sequential design (up to 3 looks) against the fixed R = 3 design, local config")
    fig.tight_layout()
    fig.savefig(RESULTS / "gate_oc_sequential.png", dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["run", "tune", "report", "installed"])
    p.add_argument(
        "--split",
        default="check",
        help="cal (worlds to set rho and the futility bound) | check (fresh worlds, the reported ones); "
        "eval: the worlds an earlier spending was reported on",
    )
    p.add_argument("--n", type=int, default=None, help="worlds per setting (default: 300 for the targets)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=None, help="stop taking results after this many seconds")
    p.add_argument("--match", default="", help="only settings whose name contains this")
    args = p.parse_args()
    if args.what == "tune":
        tune(args.split)
    elif args.what == "installed":
        installed_check(args.n or 10, args.split)
    elif args.what == "report":
        report(args.split)
    else:
        run([s for s in settings(args.split, args.n) if args.match in s.name], args.workers, args.budget_s)


if __name__ == "__main__":
    main()
