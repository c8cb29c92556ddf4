"""How often the gate ships when there is nothing to ship, and how often it ships when there is.

Runs many independent sweeps through the installed `perception-sweep local` (each with its own
PERCEPTION_HOME, MLflow store, training seed and synthetic data seed, so no run is reused between
comparisons), reads each gate's decision, and counts ships with Wilson 95 % intervals:

    python studies/validity.py aa --experiment local --n 40 --parallel 5 --cpu-workers 6
    python studies/validity.py aa --control per_horizon --experiment local --n 20
    python studies/validity.py reseed --experiment local --n 20                # the fully reseeded A/A
    python studies/validity.py no_signal --experiment local --n 20
    python studies/validity.py per_horizon --experiment local --n 20          # power: shared_skip -> per_horizon
    python studies/validity.py per_horizon_null --experiment local --n 20     # its twin: every ship is false
    python studies/validity.py extremes --experiment ci --n 20 --gpus 1 --parallel 15 <scale>  # three-arm power
    python studies/validity.py extremes_null --experiment ci --n 20 --gpus 1 --parallel 15 <scale>
    python studies/validity.py ab --experiment local --n 20                   # power at the study's own effect
    python studies/validity.py ab --experiment local --n 20 --replicates 3    # ... with three replicates
    python studies/validity.py aa --experiment ci --n 45 --max-replicates 2 --parallel 15 --cpu-workers 1
                                                          # the sequential design's A/A: stops and false ships
    python studies/validity.py report                                          # table + plot from what ran

Tests: `aa` (the control against its twin: every ship is false), `reseed` (the control against
itself trained from another seed altogether, `<control>_reseed`: the noisier null), `no_signal` (the default arms in a
world whose labels no feature predicts: every ship is false), `per_horizon` (`shared_skip` against
`per_horizon` in the world built for per-horizon queries: ships are the gate's power), `per_horizon_null`
(the same arms in that world's null twin, whose events predict nothing: every ship is false), `ab` (the
study's A/B, `shared` against `per_horizon`, in the default world, where per_horizon's lift is real
and consistent across seeds: ships are the gate's power at the effect size the study has), `extremes`
(the three-arm sweep, shared / per_horizon / shared_skip, in `per_horizon_extremes`, the known yes: a
sweep counts when it ships per_horizon and its attribution says "per-horizon queries add lift beyond the
context path"), `extremes_null` (the same in its twin: a sweep counts when its attribution ships
per_horizon, every such ship false). The shipped
noise files perception/gate/noise/<experiment>.json, which one-replicate sweeps use, are written by the
product's `perception-sweep calibrate --experiment NAME --sweeps 5` (seeds from 90000, apart from every
test's here). Every sweep's outcome is appended to studies/results/validity_runs.jsonl as it ends, so
a re-run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from perception.contract import QUERY_DIAGNOSTICS as DIAGNOSTICS
from perception.studies.validity import ATTRIBUTION_TESTS, plot, print_table, summarize

RESULTS = Path(os.environ.get("PERCEPTION_VALIDITY_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = RESULTS / "validity_runs.jsonl"
SUMMARY = RESULTS / "validity.json"
PLOT = RESULTS / "validity.png"
# The gate's test: "holm+folds" (Holm, with the folds' agreement test widening se where the folds
# disagree), "holm" (one α over both rules by Holm, replicates' prediction noise counted once,
# between-fold evidence at one replicate without a noise file: before the folds' test), "t" (Satterthwaite's
# df, two unadjusted routes: before it) or "normal" (before that); a row is only ever counted with rows of
# the same evidence, and a re-run redoes rows of another.
EVIDENCE = "holm+folds"
# How the runs were seeded: "cells" (each fold and replicate its own init, `run_id.run_seed`); rows
# without it trained every fold of a replicate from one init, which the gate's evidence does not model.
SEEDING = "cells"
# Seed bases keep every test's seeds apart, and apart from perception-sweep calibrate's (90000 on).
SEED_BASE = {
    "ab": 50_000,
    "aa": 10_000,
    "no_signal": 20_000,
    "per_horizon": 30_000,
    "reseed": 40_000,
    "per_horizon_null": 60_000,
    "extremes": 80_000,
    "extremes_null": 82_000,
}


def design(test: str, control: str) -> tuple[list[str], list[str], str, str]:
    """(sweep flags, extra overrides, control, treatment) of one test."""
    if test == "aa":
        return ["--aa", "--control", control], [], control, control + "_twin"
    if test == "reseed":
        twin = control + "_reseed"
        return ["--arms", f"{control},{twin}", "--control", control, "--treatment", twin], [], control, twin
    if test == "no_signal":
        return [], ["data.synthetic_world=no_signal"], "shared", "per_horizon"
    if test == "ab":
        return [], [], "shared", "per_horizon"
    if test in ("per_horizon", "per_horizon_null"):
        return (
            ["--arms", "shared_skip,per_horizon", "--control", "shared_skip", "--treatment", "per_horizon"],
            [f"data.synthetic_world={test}"],
            "shared_skip",
            "per_horizon",
        )
    if test in ATTRIBUTION_TESTS:
        return (
            ["--arms", "shared,per_horizon,shared_skip"],
            [f"data.synthetic_world=per_horizon_{test}"],
            "shared",
            "per_horizon",
        )
    raise SystemExit(f"unknown test {test!r}")


def run_sweep(
    test: str,
    control: str,
    experiment: str,
    seed: int,
    cpu_workers: int,
    extra: list[str],
    work: Path,
    gpu: str = "",
    replicates: int = 1,
    max_replicates: int = 0,
) -> dict:
    """One sweep of `replicates` replicates, or with `max_replicates` a sequential study of up to that many
    waves; `gpu` names the GPU its trainings run on one after another ("" for CPU lanes)."""
    flags, overrides, a, b = design(test, control)
    home = work / f"{test}-{control}-{seed}"
    shutil.rmtree(home, ignore_errors=True)
    sweep_id = f"v-{test}-{control}-{seed}"
    env = {
        **os.environ,
        "PERCEPTION_HOME": str(home),
        "CUDA_VISIBLE_DEVICES": gpu,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PERCEPTION_OPS_JIT": "0",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        "perception-sweep",
        "local",
        "--sweep-id",
        sweep_id,
        "--cpu-workers",
        str(cpu_workers),
        *flags,
        *(
            ["--design", "sequential", "--max-replicates", str(max_replicates)]
            if max_replicates
            else ["--replicates", str(replicates)]
        ),
        f"experiment={experiment}",
        f"seed={seed}",
        f"data.synthetic_seed={seed}",
        "trainer.progress=false",
        *overrides,
        *extra,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    report = home / "gate" / sweep_id / "report.json"
    row = {
        "test": test,
        "experiment": experiment,
        "control": a,
        "treatment": b,
        "seed": seed,
        "replicates": replicates,
        **(
            {"design": "sequential", "max_replicates": max_replicates, "boundaries": boundaries_label()}
            if max_replicates
            else {}
        ),
        "seeding": SEEDING,
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "extra": extra,
        "device": f"cuda:{gpu}" if gpu else "cpu",
    }
    s = json.loads(report.read_text()) if report.is_file() else {}
    if s and not s.get("refused"):
        row.update(
            evidence=_evidence(s),
            decision=s.get("decision"),
            W=s.get("W"),
            G=s.get("G"),
            p=s.get("p"),
            rule=s.get("rule"),
            replicates=len(s.get("replicates") or [0]),
            training_noise=s.get("training_noise"),
            delta_per_fold={arm: s["auc"][arm]["per_fold"] for arm in (a, b)} if s.get("auc") else None,
            horizons=s.get("horizons"),
            mde_W=(s.get("mde") or {}).get("W"),
        )
        if max_replicates:  # where the study stopped, and what it trained
            row.update(
                look=s.get("look"), max_looks=s.get("max_looks"), trainings=(s.get("cost") or {}).get("trainings")
            )
        if s.get("attribution"):
            att = s["attribution"]
            row.update(
                attribution=att.get("decision"),
                verdict=att.get("verdict"),
                attribution_W=att.get("W"),
                attribution_mde_W=(att.get("mde") or {}).get("W"),
                diagnostics={
                    arm: {k: d.get(k) for k in DIAGNOSTICS} for arm, d in (s.get("diagnostics") or {}).items()
                },
            )
    else:  # no decision: keep what the gate refused for, or the sweep's own last words
        why = ("gate refused: " + "; ".join(s.get("reasons") or []) + "\n") if s.get("refused") else done.stdout[-1500:]
        row.update(decision=None, error=(why + "\n" + done.stderr[-1500:]).strip())
    if row["decision"] is not None:
        shutil.rmtree(home, ignore_errors=True)  # the outcome is all a decided sweep keeps
    else:
        row["kept_home"] = str(home)  # a failed one's runs and logs, for whoever looks into it
    return row


def boundaries_label() -> str:
    """The sequential boundaries this checkout pre-registers (a row is counted with rows of the same)."""
    from perception.gate.sequential import FUTILITY_P, SPENDING_RHO

    return f"rho {SPENDING_RHO:g}, futility p > {FUTILITY_P:g}"


def _evidence(report: dict) -> str:
    """Which gate decided a report (see EVIDENCE)."""
    if report.get("multiplicity"):
        return "holm+folds" if any("heterogeneity_p" in r for r in report.get("rules") or []) else "holm"
    return "t" if any("df" in r for r in report.get("rules") or []) else "normal"


def done_rows() -> list[dict]:
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()] if RUNS.is_file() else []


def run_test(args: argparse.Namespace) -> None:
    base = args.seed_base if args.seed_base is not None else SEED_BASE[args.test]
    # replicate r trains with seed + r: sweeps R seeds apart share no training seed
    spacing = max(args.replicates, args.max_replicates)
    seeds = list(range(base, base + args.n * spacing, spacing))
    controls = [args.control]
    have = {
        (
            r["test"],
            r["control"],
            r["seed"],
            r["experiment"],
            tuple(r.get("extra") or []),
            r.get("replicates", 1),
            r.get("max_replicates", 0),
        )
        for r in done_rows()
        if r.get("decision") and r.get("evidence", "normal") == EVIDENCE and r.get("seeding") == SEEDING
    }
    _, _, a0, _ = design(args.test, args.control)
    todo = [
        (c, s)
        for c in controls
        for s in seeds
        if (
            args.test,
            design(args.test, c)[2],
            s,
            args.experiment,
            tuple(args.extra),
            args.replicates,
            args.max_replicates,
        )
        not in have
    ]
    what = f"sequential, up to {args.max_replicates} waves" if args.max_replicates else f"R = {args.replicates}"
    print(
        f"{args.test} at {args.experiment}, {what}: {len(todo)} sweeps to run "
        f"({len(controls) * len(seeds) - len(todo)} done earlier)",
        file=sys.stderr,
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="perception-validity-"))
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    with ThreadPoolExecutor(max_workers=args.parallel) as pool, open(RUNS, "a") as out:
        futures = {}
        for i, (c, s) in enumerate(todo):
            gpu = str(i % args.gpus) if args.gpus else ""
            futures[
                pool.submit(
                    _guarded,
                    deadline,
                    run_sweep,
                    args.test,
                    c,
                    args.experiment,
                    s,
                    args.cpu_workers,
                    args.extra,
                    work,
                    gpu,
                    args.replicates,
                    args.max_replicates,
                )
            ] = (c, s)
        bar = tqdm(total=len(futures), desc=f"{args.test} sweeps", unit="sweep")
        rows_written = []
        for f in as_completed(futures):
            row = f.result()
            if row is not None:
                rows_written.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                bar.set_postfix(last=row.get("decision"))
            bar.update(1)
        bar.close()
    kept = [r["kept_home"] for r in rows_written if r.get("kept_home")]
    if kept:
        print(f"{len(kept)} sweep(s) without a decision; their homes are kept: " + ", ".join(kept), file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    report()


def _guarded(deadline, fn, *a):
    """Sweeps not started before the deadline are left for the next call (resume)."""
    if deadline is not None and time.monotonic() > deadline:
        return None
    return fn(*a)


def report() -> list[dict]:
    """The summary of every sweep run so far: a table, the JSON and the plot."""
    rows = summarize(done_rows())
    SUMMARY.write_text(
        json.dumps({"rows": rows, "machine": os.uname().nodename, "cores": os.cpu_count()}, indent=2) + "\n"
    )
    print_table(rows)
    plot(rows, PLOT)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "test",
        choices=["aa", "reseed", "no_signal", "per_horizon", "per_horizon_null", "ab", *ATTRIBUTION_TESTS, "report"],
    )
    p.add_argument("--experiment", default="local")
    p.add_argument("--n", type=int, default=40, help="independent sweeps")
    p.add_argument("--control", default="shared", help="aa: the arm twinned")
    p.add_argument("--seed-base", type=int, default=None)
    p.add_argument("--parallel", type=int, default=4, help="sweeps at once")
    p.add_argument("--cpu-workers", type=int, default=6, help="trainings at once within a sweep")
    p.add_argument("--replicates", type=int, default=1, help="replicates per sweep (the gate pools them)")
    p.add_argument(
        "--max-replicates",
        type=int,
        default=0,
        help="run each sweep as a sequential study of up to this many waves (--design sequential)",
    )
    p.add_argument("--budget-s", type=float, default=None, help="start no sweep after this many seconds")
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="spread the sweeps over this many GPUs, each sweep's trainings on one (default: CPU lanes)",
    )
    p.add_argument("extra", nargs="*", help="more overrides for every sweep, e.g. trainer.epochs=8")
    args = p.parse_intermixed_args()
    if args.test == "report":
        report()
    else:
        run_test(args)


if __name__ == "__main__":
    main()
