"""How far a legitimately resumed run's logged final AUC lies from the AUC of the predictions it saves:
the measurement behind the gate's AUC_TOLERANCE (perception/gate/inputs.py). Each trial trains a ci
run as the installed `perception-train`, kills it (SIGKILL) at one point, resumes it with the same
command, then compares every horizon's last logged val_auc_h{h} (the run's ledger) with the AUC
recomputed from its predictions/val_final.npz, and with an uninterrupted run of the same fold.

Kill points: `after_final_checkpoint` (latest.json names the last epoch: the resumed run re-evaluates
the loaded model for its predictions, the case the tolerance is for) and `mid_final_epoch` (a random
moment after the first epoch's checkpoint: the last epoch is redone).

    PYTHONPATH=. python3 studies/resume_auc_gap.py [--trials 8] [--out studies/results/resume_auc_gap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402
from perception.gate.inputs import AUC_TOLERANCE  # noqa: E402
from perception.metrics import auc  # noqa: E402
from perception.run_id import RunId  # noqa: E402

KILL_POINTS = ("after_final_checkpoint", "mid_final_epoch")
EPOCHS = 2  # experiment=ci


def command(sweep_id: str, fold: int) -> list[str]:
    run = RunId(sweep_id, "shared", fold)
    return ["perception-train", "experiment=ci", f"sweep_id={sweep_id}", *run.overrides(), "trainer.progress=false"]


def run_dir(home: Path, sweep_id: str, fold: int) -> Path:
    return RunId(sweep_id, "shared", fold).directory(home)


def latest_epoch(directory: Path) -> int:
    try:
        return int(json.loads((directory / "checkpoints" / "latest.json").read_text())["dir"].split("-")[1])
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def train_killed(home: Path, sweep_id: str, fold: int, point: str, rng: random.Random, env: dict) -> str:
    """Starts the run and kills it at `point`; returns what happened ("killed" or "finished first")."""
    directory = run_dir(home, sweep_id, fold)
    proc = subprocess.Popen(command(sweep_id, fold), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = EPOCHS if point == "after_final_checkpoint" else 1
    while proc.poll() is None and latest_epoch(directory) < target:
        time.sleep(0.005)
    if point == "mid_final_epoch":
        time.sleep(rng.uniform(0.0, 2.0))
    if proc.poll() is not None:
        return "finished first"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return "finished first" if (directory / "done.json").exists() else "killed"


def gaps(directory: Path, horizons: list[int]) -> dict[str, float]:
    """|last logged val_auc_h{h} - AUC of predictions/val_final.npz| per horizon."""
    entries = [json.loads(line) for line in (directory / "tracking.jsonl").read_text().splitlines() if line.strip()]
    logged = [e for e in entries if e["op"] == "metrics"][-1]["values"]
    with np.load(directory / "predictions" / "val_final.npz") as z:
        probs, labels, mask = z["probs"], z["labels"], z["mask"].astype(bool)
    return {
        f"h{h}": abs(logged[f"val_auc_h{h}"] - auc(probs[mask[:, j], j], labels[mask[:, j], j]))
        for j, h in enumerate(horizons)
    }


def final_metrics(directory: Path) -> dict[str, float]:
    return json.loads((directory / "done.json").read_text())["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="kill-and-resume trials, alternating kill points")
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("studies/results/resume_auc_gap.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="resume-auc-gap-") as tmp:
        home = Path(tmp)
        env = {**os.environ, "PERCEPTION_HOME": str(home)}
        env.pop("MLFLOW_TRACKING_URI", None)
        from perception.train.compose import composed

        horizons = list(composed(["experiment=ci"]).data.horizons)
        reference = {}
        for fold in range(args.folds):  # uninterrupted runs: the bit-identity check
            subprocess.run(command("reference", fold), env=env, check=True, capture_output=True)
            reference[fold] = final_metrics(run_dir(home, "reference", fold))

        rows = []
        t0 = time.perf_counter()
        for i in range(args.trials):
            point, fold, sweep_id = KILL_POINTS[i % 2], i % args.folds, f"trial-{i}"
            what = train_killed(home, sweep_id, fold, point, rng, env)
            resumed = subprocess.run(command(sweep_id, fold), env=env, capture_output=True, text=True)
            if resumed.returncode != 0:
                raise SystemExit(f"trial {i}: the resumed run exited {resumed.returncode}:\n{resumed.stdout[-2000:]}")
            directory = run_dir(home, sweep_id, fold)
            g = gaps(directory, horizons)
            final = final_metrics(directory)
            same = all(final[f"val_auc_h{h}"] == reference[fold][f"val_auc_h{h}"] for h in horizons)
            rows.append(
                {
                    "trial": i,
                    "kill_point": point,
                    "fold": fold,
                    "outcome": what,
                    "re_evaluated": "resuming" in resumed.stdout,
                    "max_gap": max(g.values()),
                    "gaps": g,
                    "equals_uninterrupted": same,
                }
            )
            elapsed = time.perf_counter() - t0
            eta = elapsed / (i + 1) * (args.trials - i - 1)
            print(
                f"[{i + 1}/{args.trials}] {point} fold {fold}: {what}, max |gap| {rows[-1]['max_gap']:.3g}, "
                f"equal to uninterrupted: {same} · {elapsed:.0f} s, ETA {eta:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    killed = [r for r in rows if r["outcome"] == "killed"]
    print(f"\n{'trial':>5}  {'kill point':<24} {'fold':>4}  {'outcome':<15} {'max |gap|':>10}  equal to uninterrupted")
    for r in rows:
        print(
            f"{r['trial']:>5}  {r['kill_point']:<24} {r['fold']:>4}  {r['outcome']:<15} {r['max_gap']:>10.3g}  "
            f"{r['equals_uninterrupted']}"
        )
    worst = max((r["max_gap"] for r in killed), default=float("nan"))
    print(
        f"\nkilled and resumed: {len(killed)} of {len(rows)}; largest |logged - recomputed| over "
        f"{len(killed) * len(horizons)} (run, horizon) pairs: {worst:.3g}; gate tolerance {AUC_TOLERANCE:g}"
    )
    result = {
        "machine": {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "experiment": "ci",
        "horizons": horizons,
        "trials": rows,
        "n_killed": len(killed),
        "max_gap_killed": worst,
        "tolerance": AUC_TOLERANCE,
        "all_equal_uninterrupted": all(r["equals_uninterrupted"] for r in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
