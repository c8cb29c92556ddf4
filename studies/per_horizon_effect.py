"""The effect the `per_horizon` world plants: per-horizon − `shared_skip` AUC per horizon, over seeds.

Runs one three-arm sweep (`perception-sweep local --arms shared,per_horizon,shared_skip`) per seed, each
with its own PERCEPTION_HOME, training seed and synthetic data seed, and reads the final AUC of every arm
and fold from the gate's report:

    python studies/per_horizon_effect.py --world per_horizon --seeds 70000:70010 --parallel 5 \\
        experiment=ci data.n_snapshots=60000 trainer.epochs=4 trainer.max_train_batches=100 \\
        trainer.batch_size=32 trainer.lr=2e-3 trainer.query_lr_scale=30
    python studies/per_horizon_effect.py --report          # table + JSON from what ran

A seed's effect is the mean over its folds; the summary gives mean and sd over seeds per horizon for
per_horizon − shared_skip (the lift of per-horizon queries beyond the context path), per_horizon − shared
and shared_skip − shared, with each sweep's gate decision, attribution verdict and query diagnostics.
Every sweep's row is appended to studies/results/per_horizon_effect_runs.jsonl as it ends (resume:
a setting's seeds already there are not run again). Seeds 70000+ are this script's, apart from
validity.py's.
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

import numpy as np
from tqdm import tqdm

from perception.contract import QUERY_DIAGNOSTICS as DIAGNOSTICS
from perception.studies.per_horizon_effect import last_epoch, print_summary, summarize

RESULTS = Path(os.environ.get("PERCEPTION_EFFECT_RESULTS", Path(__file__).resolve().parent / "results"))
RUNS = RESULTS / "per_horizon_effect_runs.jsonl"
SUMMARY = RESULTS / "per_horizon_effect.json"
ARMS = ("shared", "per_horizon", "shared_skip")  # the default: the three-arm sweep


def run_sweep(world: str, seed: int, extra: list[str], cpu_workers: int, work: Path, arms: tuple[str, ...]) -> dict:
    home = work / f"{world}-{seed}"
    shutil.rmtree(home, ignore_errors=True)
    sweep_id = f"e-{world}-{seed}"
    env = {
        **os.environ,
        "PERCEPTION_HOME": str(home),
        "CUDA_VISIBLE_DEVICES": "",
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
        "--arms",
        ",".join(arms),
        *([] if "shared" in arms else ["--control", "shared_skip", "--treatment", "per_horizon"]),
        f"seed={seed}",
        f"data.synthetic_seed={seed}",
        f"data.synthetic_world={world}",
        "trainer.progress=false",
        *extra,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    report = home / "gate" / sweep_id / "report.json"
    row = {
        "world": world,
        "seed": seed,
        "arms": list(arms),
        "extra": extra,
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": os.uname().nodename,
    }
    s = json.loads(report.read_text()) if report.is_file() else {}
    if s.get("runs"):
        horizons = s["horizons"]
        auc = {
            arm: [[s["runs"][f"{arm}/f{f}"]["final_auc"][str(h)] for h in horizons] for f in range(s["n_folds"])]
            for arm in arms
        }
        attribution = s.get("attribution") or ({"decision": s.get("decision")} if "shared" not in arms else {})
        row.update(
            horizons=horizons,
            auc=auc,
            decision=s.get("decision"),
            attribution=attribution.get("decision"),
            verdict=attribution.get("verdict"),
            W=s.get("W"),
            p=s.get("p"),
            diagnostics={
                arm: {k: (s.get("diagnostics") or {}).get(arm, {}).get(k) for k in DIAGNOSTICS} for arm in arms
            },
        )
        shutil.rmtree(home, ignore_errors=True)
    else:
        row.update(auc=None, error=(done.stdout[-1500:] + "\n" + done.stderr[-1500:]).strip(), kept_home=str(home))
    return row


def run_trainings(
    world: str, seed: int, extra: list[str], folds: list[int], work: Path, arms: tuple[str, ...], gpu: bool = False
) -> dict:
    """The trainer directly (no sweep, no gate): every arm on `folds` at once, one process each (on CPU,
    or all sharing the visible GPU with `gpu`); the final epoch's validation AUCs and query diagnostics
    from each run's last epoch line."""
    env = {
        **os.environ,
        "PERCEPTION_HOME": str(work / f"{world}-{seed}"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PERCEPTION_OPS_JIT": "0",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.perf_counter()
    procs = {
        (arm, f): subprocess.Popen(
            [
                "perception-train",
                f"arm={arm}",
                f"data.fold={f}",
                f"seed={seed}",
                f"data.synthetic_seed={seed}",
                f"data.synthetic_world={world}",
                "trainer.progress=false",
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for arm in arms
        for f in folds
    }
    last = {key: last_epoch(p.communicate()[0]) for key, p in procs.items()}
    row = {
        "world": world,
        "seed": seed,
        "arms": list(arms),
        "extra": extra,
        "mode": f"trainer folds {folds}" + (" gpu" if gpu else ""),
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": os.uname().nodename,
    }
    if any(v is None for v in last.values()):
        row.update(auc=None, error=f"runs without a final epoch: {[k for k, v in last.items() if v is None]}")
        return row
    horizons = sorted(
        int(k[len("val_auc_h") :])
        for k in next(iter(last.values()))
        if k.startswith("val_auc_h") and k[len("val_auc_h") :].isdigit()
    )
    row.update(
        horizons=horizons,
        decision=None,
        attribution=None,
        verdict=None,
        W=None,
        p=None,
        auc={arm: [[last[arm, f][f"val_auc_h{h}"] for h in horizons] for f in folds] for arm in arms},
        diagnostics={
            arm: {k: float(np.median([last[arm, f].get(k, np.nan) for f in folds])) for k in DIAGNOSTICS}
            for arm in arms
        },
    )
    shutil.rmtree(env["PERCEPTION_HOME"], ignore_errors=True)
    return row


def done_rows() -> list[dict]:
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()] if RUNS.is_file() else []


def run(args: argparse.Namespace) -> None:
    lo, hi = (int(x) for x in args.seeds.split(":"))
    mode = (
        f"trainer folds {[int(f) for f in args.folds.split(',')]}" + (" gpu" if args.gpu else "")
        if args.folds is not None
        else "sweep"
    )
    have = {
        (r["world"], r["seed"], tuple(r["arms"]), tuple(r["extra"]), r.get("mode", "sweep"))
        for r in done_rows()
        if r.get("auc")
    }
    todo = [
        s for s in range(lo, hi) if (args.world, s, tuple(args.arms.split(",")), tuple(args.extra), mode) not in have
    ]
    print(f"{args.world}: {len(todo)} sweeps to run ({hi - lo - len(todo)} done earlier)", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="perception-effect-"))
    with ThreadPoolExecutor(max_workers=args.parallel) as pool, open(RUNS, "a") as out:
        arms = tuple(a.strip() for a in args.arms.split(","))
        if args.folds is not None:
            folds = [int(f) for f in args.folds.split(",")]
            futures = [pool.submit(run_trainings, args.world, s, args.extra, folds, work, arms, args.gpu) for s in todo]
        else:
            futures = [pool.submit(run_sweep, args.world, s, args.extra, args.cpu_workers, work, arms) for s in todo]
        for f in tqdm(as_completed(futures), total=len(futures), desc=f"{args.world} sweeps", unit="sweep"):
            row = f.result()
            out.write(json.dumps(row) + "\n")
            out.flush()
            if row.get("error"):
                print(
                    f"seed {row['seed']}: no result ({row.get('kept_home', 'no home kept')})\n{row['error']}",
                    file=sys.stderr,
                )


def report() -> dict:
    """The summary of every sweep run so far: the JSON and a table per setting."""
    doc = summarize(done_rows())
    RESULTS.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(doc, indent=2) + "\n")
    print_summary(doc)
    return doc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--world",
        default="per_horizon",
        choices=["per_horizon", "per_horizon_null", "per_horizon_extremes", "per_horizon_extremes_null", "default"],
    )
    p.add_argument("--seeds", default="70000:70010", help="lo:hi, a half-open range")
    p.add_argument("--parallel", type=int, default=2, help="sweeps at once")
    p.add_argument("--cpu-workers", type=int, default=3, help="trainings at once within a sweep")
    p.add_argument(
        "--arms",
        default=",".join(ARMS),
        help="arms of each sweep; without shared the gate decides shared_skip -> per_horizon itself",
    )
    p.add_argument(
        "--folds", default=None, help="e.g. 0 or 0,1,2: run the trainer directly on these folds (no sweep, no gate)"
    )
    p.add_argument("--gpu", action="store_true", help="with --folds: the trainings share the visible GPU")
    p.add_argument("--report", action="store_true", help="only summarize what ran")
    p.add_argument("extra", nargs="*", help="overrides for every sweep, e.g. experiment=ci trainer.epochs=4")
    args = p.parse_intermixed_args()
    if not args.report:
        run(args)
    report()


if __name__ == "__main__":
    main()
