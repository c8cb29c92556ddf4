"""Does training quality hold at the faster settings? Final validation AUC per horizon of runs at each
setting against the seed-to-seed spread of fp32 runs, all made by the installed `perception-train`.

    python3 studies/precision_quality.py --experiment local --fp32-seeds 5 \\
        --settings tf32 bf16 tf32+compiled bf16+compiled+fla --parallel 8
    python3 studies/precision_quality.py --experiment production --fp32-seeds 3 --settings bf16+compiled+fla \\
        --parallel 4 --tag production_short -- data.n_snapshots=300000 trainer.epochs=2 trainer.max_train_batches=40

fp32 trains at seeds s .. s+N-1; every other setting at seeds s .. s+M-1 (--setting-seeds M <= N, default
1), each with the same data, init and batch order as the fp32 run of its seed. A setting is a '+'-joined
list: a precision (fp32, tf32, bf16), `compiled` (model.compile_trunk=true), `fla` or `mamba` (model.mamba.ssd)
`fusedgrn` (model.vsn.fused_grn=true) and `folded` (model.vsn.fold_embed=true).

The margin at a horizon is the fp32 runs' seed-to-seed standard deviation there: what a new seed changes.
With M = 1 a setting holds at a horizon when its AUC differs from the same-seed fp32 run's by no more than
the margin. One pair is a weak test: a different summation order alone can send a training run down
another path, and at small scale that moves a same-seed difference by a seed's worth. With M >= 2 the
verdict is an equivalence test on the M paired differences (setting − fp32, same seed): `holds` when their
mean's 90% t-interval lies inside ±margin (two one-sided tests at 5%), `differs` when it lies outside,
`inconclusive` otherwise; a setting holds when every horizon holds and differs when any horizon differs.
With --fp32-from ROWS.jsonl the fp32 runs come from an earlier study of the same code on the same GPU model
(a new setting checked against fp32 runs already made). Whether the setting's AUC lies inside the fp32
runs' [min, max] is recorded too, and what each setting trained (precision, compiled trunk, SSD, VSN forms from
each run's config.yaml: a switch a setting leaves unnamed takes the experiment's value); runs of one setting
that trained different forms are not joined. Writes JSON and a plot to studies/results/."""

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

import yaml

from perception.studies.precision_quality import form_of, overrides_of, summarise


def train_one(setting: str, seed: int, args, work: Path) -> dict:
    home = work / f"{setting}-{seed}"
    shutil.rmtree(home, ignore_errors=True)
    env = {**os.environ, "PERCEPTION_HOME": str(home), "OMP_NUM_THREADS": "1", "PERCEPTION_OPS_JIT": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)  # each run tracks into sqlite under its own home
    cmd = [
        "perception-train",
        f"experiment={args.experiment}",
        f"seed={seed}",
        f"data.synthetic_seed={seed}",
        f"trainer.device={args.device}",
        "trainer.progress=false",
        "tracking.system_metrics=false",
        f"sweep_id=quality-{setting.replace('+', '-')}-{seed}",
        *args.overrides,
        *overrides_of(setting),  # last: a setting's own switches win over the study's overrides
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    row = dict(
        setting=setting,
        seed=seed,
        returncode=done.returncode,
        seconds=round(time.perf_counter() - t0, 1),
        experiment=args.experiment,
        overrides=args.overrides,
        machine=args.machine,
    )
    found = sorted(home.glob("runs/**/done.json"))
    if done.returncode == 0 and found:
        metrics = json.loads(found[0].read_text())["metrics"]
        config = found[0].parent / "config.yaml"
        try:
            row["form"] = form_of(yaml.safe_load(config.read_text()), str(config))
        except (OSError, ValueError, yaml.YAMLError) as e:
            row["error"] = [f"the run finished but what it trained cannot be read: {e}"]
            return row
        row["auc"] = {k.removeprefix("val_auc_h"): v for k, v in metrics.items() if k.startswith("val_auc_h")}
        row["samples_per_s"] = metrics.get("samples_per_s")
    else:
        row["error"] = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return row


def print_table(summary: dict) -> None:
    hs = summary["horizons"]
    print(f"\nfinal validation AUC per horizon; fp32 over {summary['fp32_runs']} seeds: mean [min, max] (sd)")
    w = 29 if any(len(st["seeds"]) > 1 for st in summary["settings"].values()) else 25
    print(f"{'':22}" + "".join(f"{'h' + h:>{w}}" for h in hs))
    s = summary["fp32_spread"]
    print(
        f"{'fp32 seeds':22}"
        + "".join(f"{s[h]['mean']:.4f} [{s[h]['min']:.4f}, {s[h]['max']:.4f}]".rjust(w) for h in hs)
    )
    print(f"{'fp32 seed sd':22}" + "".join(f"{s[h]['sd']:{w}.4f}" for h in hs))
    paired = False
    for name, st in summary["settings"].items():
        cells = []
        for h in hs:
            v = st["per_horizon"][h]
            if "equivalence" in v:
                paired, e = True, v["equivalence"]
                mark = {"holds": " ", "differs": "!", "inconclusive": "?"}[e["verdict"]]
                cells.append(
                    f"{e['mean_delta']:+.4f} [{e['interval'][0]:+.4f}, {e['interval'][1]:+.4f}]{mark}".rjust(w)
                )
            else:
                mark = " " if v["within_sd"] else "!"
                cells.append(f"{v['auc']:.4f} ({v['delta_same_seed']:+.4f}){mark}".rjust(w))
        label = f"{name} ({len(st['seeds'])} seeds)" if len(st["seeds"]) > 1 else name
        print(f"{label:22}" + "".join(cells) + f"   {st['verdict']}")
    if paired:
        print(
            "(paired rows: mean difference to the same-seed fp32 runs [90% t-interval]; ' ': inside ±fp32 seed sd, "
            "'!': outside, '?': straddles it)"
        )
    print("(single rows: AUC (difference to the fp32 run of the same seed); '!': larger than the fp32 seed sd)")
    print("what each setting trained (its runs' resolved configs; settings leave unnamed switches to the experiment):")
    for name, form in summary["forms"].items():
        trained = " ".join(f"{k}={v}" for k, v in form.items()) if form else "not recorded (older rows)"
        print(f"  {name}: {trained}")


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
        n = len(st["seeds"])
        ax.plot(
            xs,
            [st["per_horizon"][h]["auc"] for h in hs],
            "o-",
            ms=4,
            lw=1,
            label=f"{name} (mean of {n} seeds)" if n > 1 else name,
        )
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
    p.add_argument(
        "--setting-seeds",
        type=int,
        default=1,
        help="seeds per setting (<= --fp32-seeds); >= 2 gives the paired equivalence verdict",
    )
    p.add_argument("--settings", nargs="+", default=["tf32", "bf16", "tf32+compiled", "bf16+compiled"])
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tag", default=None, help="result file name (default: precision_quality_<experiment>)")
    p.add_argument(
        "--from-rows",
        nargs="+",
        type=Path,
        default=None,
        metavar="ROWS.jsonl",
        help="train nothing: summarise the finished runs these files hold (a killed study's, or "
        "studies of the same code over disjoint seeds, e.g. --seed 0 and --seed 5)",
    )
    p.add_argument(
        "--fp32-from",
        type=Path,
        default=None,
        metavar="ROWS.jsonl",
        help="train no fp32 runs: pair the settings' runs with the fp32 runs of this file (same experiment, "
        "overrides and GPU model; its seeds must cover --seed .. --seed + --fp32-seeds - 1)",
    )
    p.add_argument("--machine", default=None, help="with --from-rows: the machine of rows that name none")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = p.parse_args()
    if args.from_rows:
        return write_result(read_rows(args.from_rows, args), args)
    import torch

    args.machine = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for s in args.settings:
        overrides_of(s)
    if not 1 <= args.setting_seeds <= args.fp32_seeds:
        raise SystemExit(
            f"--setting-seeds {args.setting_seeds}: expected 1 .. --fp32-seeds ({args.fp32_seeds}), "
            "each setting's run is paired with the fp32 run of its seed"
        )
    fp32_rows = fp32_runs_of(args) if args.fp32_from else []
    if shutil.which("perception-train") is None:
        raise SystemExit("perception-train is not on PATH: install the package (pip install -e .)")
    # seed by seed, each fp32 run beside the runs paired with it: a killed study keeps whole pairs, and at
    # most about half the runs at once are fp32's, the largest (an 80 GiB GPU holds two at production K)
    jobs = []
    for i in range(args.fp32_seeds):
        if not fp32_rows:
            jobs.append(("fp32", args.seed + i))
        jobs += [(s, args.seed + i) for s in args.settings if i < args.setting_seeds]
    work = Path(tempfile.mkdtemp(prefix="precision-quality-"))
    out, tag = results_place(args)
    finished = out / f"{tag}.rows.jsonl"  # one line per finished run: a killed study keeps what it ran
    finished.unlink(missing_ok=True)
    rows = list(fp32_rows)
    from tqdm import tqdm

    with ThreadPoolExecutor(args.parallel) as pool, tqdm(total=len(jobs), unit="run", file=sys.stderr) as bar:
        futures = [pool.submit(train_one, s, seed, args, work) for s, seed in jobs]
        for f in as_completed(futures):
            row = f.result()
            rows.append(row)
            with finished.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            bar.set_description(f"{row['setting']} seed {row['seed']}: {'ok' if 'auc' in row else 'FAILED'}")
            bar.update(1)
    return write_result(rows, args)


def read_rows(paths: list[Path], args) -> list[dict]:
    """The runs that the files hold, all of `args.experiment` and its overrides (rows from before these
    were recorded take them from `args`); a (setting, seed) in two files is refused (which one counts?)."""
    rows, seen = [], {}
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"--from-rows {path}: no such file")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                row = json.loads(line)
                key = (row["setting"], row["seed"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{n}: expected a JSON run row with 'setting' and 'seed' ({e})")
            if key in seen:
                raise SystemExit(f"{path}:{n}: {key[0]} seed {key[1]} is also in {seen[key]}")
            row.setdefault("experiment", args.experiment)
            row.setdefault("overrides", args.overrides)
            row.setdefault("machine", args.machine)
            if (row["experiment"], row["overrides"]) != (args.experiment, args.overrides):
                raise SystemExit(
                    f"{path}:{n}: a run of experiment={row['experiment']} {row['overrides']}; expected "
                    f"--experiment {args.experiment} and overrides {args.overrides}"
                )
            seen[key] = f"{path}:{n}"
            rows.append(row)
    return rows


def fp32_runs_of(args) -> list[dict]:
    """--fp32-from's finished fp32 runs at the study's seeds, made on this GPU model (a pair from two GPU
    models would measure the GPUs' kernels as well as the setting)."""
    seeds = range(args.seed, args.seed + args.fp32_seeds)
    runs = [r for r in read_rows([args.fp32_from], args) if r["setting"] == "fp32" and r["seed"] in seeds]
    runs = [r for r in runs if "auc" in r]
    missing = sorted(set(seeds) - {r["seed"] for r in runs})
    if missing:
        raise SystemExit(f"--fp32-from {args.fp32_from}: no finished fp32 run at seed(s) {missing}")
    machines = {r["machine"] for r in runs}
    if machines != {args.machine}:
        raise SystemExit(
            f"--fp32-from {args.fp32_from}: its fp32 runs were made on {sorted(map(str, machines))}, "
            f"expected this GPU, {args.machine}"
        )
    return runs


def results_place(args) -> tuple[Path, str]:
    """The results folder (made if missing) and the files' name."""
    out = Path(os.environ.get("PERCEPTION_RESULTS", Path(__file__).parent / "results"))
    out.mkdir(parents=True, exist_ok=True)
    return out, args.tag or f"precision_quality_{args.experiment}"


def write_result(rows: list[dict], args) -> int:
    out, tag = results_place(args)
    for r in rows:
        if "error" in r:
            print(f"{r['setting']} seed {r['seed']} failed (exit {r['returncode']}):\n  " + "\n  ".join(r["error"]))
    summary = summarise(rows, args.seed)
    print_table(summary)
    machine = ", ".join(sorted({str(r.get("machine")) for r in rows}))
    result = dict(
        experiment=args.experiment,
        overrides=args.overrides,
        machine=machine,
        seed=args.seed,
        runs=sorted(rows, key=lambda r: (r["setting"], r["seed"])),
        **summary,
    )
    (out / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(summary, out / f"{tag}.png", f"{args.experiment} {' '.join(args.overrides)}".strip())
    print(f"wrote {out / (tag + '.json')} and .png")
    return 0 if all("auc" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
