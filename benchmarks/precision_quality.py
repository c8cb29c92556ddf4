"""Does training quality hold at the faster settings? Final validation AUC per horizon of runs at each
setting against the seed-to-seed spread of fp32 runs, all made by the installed `perception-train`.

    python3 benchmarks/precision_quality.py --experiment local --fp32-seeds 5 \\
        --settings tf32 bf16 tf32+compiled bf16+compiled+fla --parallel 8
    python3 benchmarks/precision_quality.py --experiment production --fp32-seeds 3 --settings bf16+compiled+fla \\
        --parallel 4 --tag production_short -- data.n_snapshots=300000 trainer.epochs=2 trainer.max_train_batches=40

fp32 trains at seeds s .. s+N-1; every other setting at seed s (the same data, init and batch order as
fp32's first run). A setting is a '+'-joined list: a precision (fp32, tf32, bf16), `compiled`
(model.compile_trunk=true) and `fla` (model.mamba.ssd=fla). It holds at a horizon when its AUC differs
from the same-seed fp32 run's by no more than the fp32 runs' seed-to-seed standard deviation there: what
the setting changes is smaller than what a new seed changes. Whether it lies inside the fp32 runs'
[min, max] is recorded too. Writes JSON and a plot to benchmarks/results/."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

PRECISIONS = ("fp32", "tf32", "bf16")


def overrides_of(setting: str) -> list[str]:
    """'bf16+compiled+fla' -> Hydra overrides; an unknown part is an error naming it."""
    out = []
    for part in setting.split("+"):
        if part in PRECISIONS:
            out.append(f"trainer.precision={part}")
        elif part == "compiled":
            out.append("model.compile_trunk=true")
        elif part == "fla":
            out.append("model.mamba.ssd=fla")
        else:
            raise SystemExit(f"--settings {setting!r}: unknown part {part!r}; expected {', '.join(PRECISIONS)}, "
                             f"compiled or fla, joined by '+'")
    if not any(p.startswith("trainer.precision=") for p in out):
        raise SystemExit(f"--settings {setting!r}: name a precision ({', '.join(PRECISIONS)})")
    return out


def train_one(setting: str, seed: int, args, work: Path) -> dict:
    home = work / f"{setting}-{seed}"
    shutil.rmtree(home, ignore_errors=True)
    env = {**os.environ, "PERCEPTION_HOME": str(home), "OMP_NUM_THREADS": "1", "PERCEPTION_OPS_JIT": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)  # each run tracks into sqlite under its own home
    cmd = ["perception-train", f"experiment={args.experiment}", f"seed={seed}", f"data.synthetic_seed={seed}",
           f"trainer.device={args.device}", "trainer.progress=false", "tracking.system_metrics=false",
           f"sweep_id=quality-{setting.replace('+', '-')}-{seed}", *overrides_of(setting), *args.overrides]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    row = dict(setting=setting, seed=seed, returncode=done.returncode, seconds=round(time.perf_counter() - t0, 1))
    found = sorted(home.glob("runs/**/done.json"))
    if done.returncode == 0 and found:
        metrics = json.loads(found[0].read_text())["metrics"]
        row["auc"] = {k.removeprefix("val_auc_h"): v for k, v in metrics.items()
                      if k.startswith("val_auc_h")}
        row["samples_per_s"] = metrics.get("samples_per_s")
    else:
        row["error"] = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return row


def summarise(rows: list[dict], base_seed: int) -> dict:
    fp32 = [r for r in rows if r["setting"] == "fp32" and "auc" in r]
    if len(fp32) < 2:
        raise SystemExit(f"need at least 2 finished fp32 runs for a spread; have {len(fp32)}")
    horizons = sorted(fp32[0]["auc"], key=int)
    spread = {h: dict(min=min(r["auc"][h] for r in fp32), max=max(r["auc"][h] for r in fp32),
                      mean=statistics.mean(r["auc"][h] for r in fp32), sd=statistics.stdev(r["auc"][h] for r in fp32))
              for h in horizons}
    same_seed = next((r for r in fp32 if r["seed"] == base_seed), None)
    if same_seed is None:
        raise SystemExit(f"the fp32 run of seed {base_seed} did not finish: no same-seed comparison")
    settings = {}
    for r in rows:
        if r["setting"] == "fp32" or "auc" not in r:
            continue
        per_h = {}
        for h in horizons:
            auc = r["auc"][h]
            delta = auc - same_seed["auc"][h]
            per_h[h] = dict(auc=auc, delta_same_seed=delta, within_sd=abs(delta) <= spread[h]["sd"],
                            inside_range=spread[h]["min"] <= auc <= spread[h]["max"])
        settings[r["setting"]] = dict(per_horizon=per_h, holds=all(v["within_sd"] for v in per_h.values()),
                                      samples_per_s=r.get("samples_per_s"))
    return dict(horizons=horizons, fp32_spread=spread, fp32_runs=len(fp32), settings=settings)


def print_table(summary: dict) -> None:
    hs = summary["horizons"]
    print(f"\nfinal validation AUC per horizon; fp32 over {summary['fp32_runs']} seeds: mean [min, max] (sd)")
    w = 25
    print(f"{'':22}" + "".join(f"{'h' + h:>{w}}" for h in hs))
    s = summary["fp32_spread"]
    print(f"{'fp32 seeds':22}" + "".join(f"{s[h]['mean']:.4f} [{s[h]['min']:.4f}, {s[h]['max']:.4f}]".rjust(w) for h in hs))
    print(f"{'fp32 seed sd':22}" + "".join(f"{s[h]['sd']:{w}.4f}" for h in hs))
    for name, st in summary["settings"].items():
        cells = []
        for h in hs:
            v = st["per_horizon"][h]
            mark = " " if v["within_sd"] else "!"
            cells.append(f"{v['auc']:.4f} ({v['delta_same_seed']:+.4f}){mark}".rjust(w))
        print(f"{name:22}" + "".join(cells) + f"   {'holds' if st['holds'] else 'differs by more than a seed'}")
    print("(in brackets: the difference to the fp32 run of the same seed; '!': larger than the fp32 seed sd)")


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = summary["horizons"]
    xs = range(len(hs))
    s = summary["fp32_spread"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.fill_between(xs, [s[h]["min"] for h in hs], [s[h]["max"] for h in hs], alpha=0.25, label="fp32 seeds: min-max")
    ax.plot(xs, [s[h]["mean"] for h in hs], "k--", lw=1, label="fp32 mean")
    for name, st in summary["settings"].items():
        ax.plot(xs, [st["per_horizon"][h]["auc"] for h in hs], "o-", ms=4, lw=1, label=name)
    ax.set_xticks(list(xs), [f"h{h}" for h in hs])
    ax.set_ylabel("final validation AUC")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="local")
    p.add_argument("--fp32-seeds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="the first fp32 seed, and every other setting's")
    p.add_argument("--settings", nargs="+", default=["tf32", "bf16", "tf32+compiled", "bf16+compiled"])
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tag", default=None, help="result file name (default: precision_quality_<experiment>)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = p.parse_args()
    for s in args.settings:
        overrides_of(s)
    if shutil.which("perception-train") is None:
        raise SystemExit("perception-train is not on PATH: install the package (pip install -e .)")
    jobs = [("fp32", args.seed + i) for i in range(args.fp32_seeds)] + [(s, args.seed) for s in args.settings]
    work = Path(tempfile.mkdtemp(prefix="precision-quality-"))
    rows = []
    from tqdm import tqdm

    with ThreadPoolExecutor(args.parallel) as pool, tqdm(total=len(jobs), unit="run", file=sys.stderr) as bar:
        futures = [pool.submit(train_one, s, seed, args, work) for s, seed in jobs]
        for f in as_completed(futures):
            row = f.result()
            rows.append(row)
            bar.set_description(f"{row['setting']} seed {row['seed']}: {'ok' if 'auc' in row else 'FAILED'}")
            bar.update(1)
    for r in rows:
        if "error" in r:
            print(f"{r['setting']} seed {r['seed']} failed (exit {r['returncode']}):\n  " + "\n  ".join(r["error"]))
    summary = summarise(rows, args.seed)
    print_table(summary)
    tag = args.tag or f"precision_quality_{args.experiment}"
    out = Path(os.environ.get("PERCEPTION_RESULTS", Path(__file__).parent / "results"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    machine = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result = dict(experiment=args.experiment, overrides=args.overrides, machine=machine, seed=args.seed,
                  runs=sorted(rows, key=lambda r: (r["setting"], r["seed"])), **summary)
    (out / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(summary, out / f"{tag}.png", f"{args.experiment} {' '.join(args.overrides)}".strip())
    print(f"wrote {out / (tag + '.json')} and .png")
    return 0 if all("auc" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
