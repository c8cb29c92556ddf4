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

    python benchmarks/gate_oc.py run --plan null --workers 2     # δ = 0: R in {1, 2, 3} x τ in {0.005, 0.015}
    python benchmarks/gate_oc.py run --plan power --workers 2    # δ in {0.005, 0.01, 0.02, 0.04}
    python benchmarks/gate_oc.py run --plan mde --workers 2      # δ = the median MDE the null worlds reported
    python benchmarks/gate_oc.py report                          # table, JSON and plot from what ran

Each world's outcome is appended to benchmarks/results/gate_oc_runs.jsonl as it ends, so a re-run resumes;
`report` writes gate_oc.json (ship rates with Wilson 95 % intervals, sd(W − δ) against the gate's se,
median minimum detectable effects) and gate_oc.png (P(ship) against δ).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from scipy.stats import binomtest, norm
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("PERCEPTION_GATE_OC_RESULTS", REPO / "benchmarks" / "results"))
HORIZONS = (10, 30, 100, 300, 1000)
WEIGHTED = 1000  # conf/gate/local.yaml: h1000 weighs 1; shift horizons 10, 30
BASE_AUC = (0.60, 0.58, 0.56, 0.55, 0.54)
WINDOW, STRIDE = 128, 16
TARGET_FALSE_SHIP, TARGET_UPPER = 0.05, 0.075
MDE_BAND = (0.7, 0.9)


@dataclass(frozen=True)
class Setting:
    replicates: int
    tau: float  # sd of a cell's training effect on its AUC, per horizon
    delta: float  # planted true AUC difference B − A at the weighted horizon
    n: int  # worlds
    windows: int = 2000  # validation windows a fold (28 blocks of 71 at h1000)
    shared: float = 0.7  # share of a run's prediction-noise variance common to the fold's runs
    kind: str = "null"  # "null" | "power" | "mde"

    @property
    def name(self) -> str:
        return f"{self.kind}-R{self.replicates}-tau{self.tau:g}-d{self.delta:.4f}-N{self.windows}"


def plan(name: str, n: int | None) -> list[Setting]:
    if name == "null":
        return [Setting(r, tau, 0.0, n or 300) for r in (1, 2, 3) for tau in (0.005, 0.015)]
    if name == "power":
        return [Setting(r, tau, d, n or 60, kind="power") for r, tau in ((3, 0.005), (3, 0.015), (1, 0.005))
                for d in (0.005, 0.01, 0.02, 0.04)]
    if name == "mde":  # δ = the median MDE that worlds at the last δ reported (first the null's), once more
        out = []
        for r, tau in ((3, 0.005), (2, 0.015), (1, 0.005)):
            rows = [row for row in done_rows() if row["replicates"] == r and row["tau"] == tau
                    and row["kind"] in ("null", "mde") and row.get("mde_W") is not None]
            if not any(row["kind"] == "null" for row in rows):
                raise SystemExit(f"no null worlds at R = {r}, τ = {tau} yet: run --plan null first")
            last = max(rows, key=lambda row: (row["kind"] == "mde", row["delta"]))["delta"]
            mdes = [row["mde_W"] for row in rows if row["delta"] == last]
            out.append(Setting(r, tau, round(float(np.median(mdes)), 4), n or 150, kind="mde"))
        return out
    raise SystemExit(f"unknown plan {name!r}: expected null, power or mde")


# ---------------------------------------------------------------- worlds


def _moving_average(rng: np.random.Generator, n: int, span: int) -> np.ndarray:
    """(n,) unit-variance moving average of `span` i.i.d. normals: windows `span` apart share nothing."""
    c = np.concatenate([[0.0], np.cumsum(rng.normal(size=n + span - 1))])
    return (c[span:] - c[:-span]) / math.sqrt(span)


def separation(auc: np.ndarray) -> np.ndarray:
    """μ with Φ(μ/√2) = auc: the score shift between the classes under unit-variance noise."""
    return math.sqrt(2.0) * norm.ppf(np.clip(auc, 1e-6, 1 - 1e-6))


def world_cells(s: Setting, seed: int, folds: int = 3) -> dict[tuple[str, int, int], dict[str, np.ndarray]]:
    """{(arm, fold, replicate): predictions/val_final.npz fields} of one world."""
    rng = np.random.default_rng(seed)
    n, hz = s.windows, len(HORIZONS)
    planted = np.array([s.delta if h == WEIGHTED else 0.0 for h in HORIZONS])
    cells = {}
    for fold in range(folds):
        # a label looks h snapshots ahead: windows closer than h / stride share its future
        y = np.stack([_moving_average(rng, n, max(1, h // STRIDE)) > 0 for h in HORIZONS], axis=1)  # (n, H)
        common = np.stack([_moving_average(rng, n, WINDOW // STRIDE) for _ in HORIZONS], axis=1)  # (n, H)
        mask = np.ones((n, hz), dtype=bool)
        for j, h in enumerate(HORIZONS):
            mask[n - max(1, h // STRIDE):, j] = False  # labels past the fold's end do not exist
        index = fold * 1_000_000 + WINDOW + STRIDE * np.arange(n, dtype=np.int64)
        for rep in range(s.replicates):
            for arm, lift in (("shared", 0.0 * planted), ("per_horizon", planted)):
                auc = np.asarray(BASE_AUC) + lift + s.tau * rng.normal(size=hz)  # the cell's training effect
                own = np.stack([_moving_average(rng, n, WINDOW // STRIDE) for _ in HORIZONS], axis=1)
                score = separation(auc) * y + math.sqrt(s.shared) * common + math.sqrt(1 - s.shared) * own
                cells[(arm, fold, rep)] = {"probs": (1 / (1 + np.exp(-score))).astype(np.float32),
                                           "labels": y.astype(np.uint8), "mask": mask, "index": index}
    return cells


def world_seed(s: Setting, i: int) -> int:
    """Its own seed per setting and world: no two settings share a world's draws."""
    return zlib.crc32(s.name.encode()) * 100_003 + i


# ---------------------------------------------------------------- one world through the installed gate


def _gate_command() -> str:
    here = Path(sys.executable).parent / "perception-gate"
    return str(here) if here.is_file() else "perception-gate"


def run_worlds(task: tuple[Setting, list[int], str]) -> list[dict]:
    """Worlds i of one setting, each its own sweep in one fresh store, decided by one call of the
    installed gate (repeated --sweep-id: each decided as if alone, one import of the gate for all)."""
    s, worlds, template = task
    sys.path.insert(0, str(REPO))  # the tests' store builder logs runs exactly as the trainings do
    from mlflow.tracking import MlflowClient

    from tests.gate.sweep_store import SweepSpec, log_sweep

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gate-oc-") as tmp:
        tmp = Path(tmp)
        shutil.copy(template, tmp / "mlflow.db")  # a migrated empty store: no migrations per world
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        client.create_experiment("perception-ab", artifact_location=(tmp / "artifacts").as_uri())
        for i in worlds:
            spec = SweepSpec(mu_a=[0.0] * 5, mu_b=[0.0] * 5, horizons=list(HORIZONS), n_windows=s.windows,
                             window=WINDOW, stride=STRIDE, epochs=2, seed=world_seed(s, i), replicates=s.replicates)
            log_sweep(client, f"oc-{i}", spec, world_cells(s, world_seed(s, i)), attention=False)  # decisions only
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MLFLOW_DISABLE_TELEMETRY": "true"}
        ids = [a for i in worlds for a in ("--sweep-id", f"oc-{i}")]
        done = subprocess.run([_gate_command(), *ids, "--tracking-uri", uri, "--config", "local",
                               "--out", str(tmp / "report"), "--no-progress"], capture_output=True, text=True, env=env)
        reports = {i: tmp / "report" / f"oc-{i}" / "report.json" for i in worlds}
        decided = {i: json.loads(f.read_text()) for i, f in reports.items() if f.is_file()}
    seconds = round((time.perf_counter() - t0) / len(worlds), 2)
    return [_row(s, i, done, decided.get(i, {}), seconds) for i in worlds]


def _row(s: Setting, i: int, done: subprocess.CompletedProcess, r: dict, seconds: float) -> dict:
    row = {"setting": s.name, **asdict(s), "world": i, "seed": world_seed(s, i), "returncode": done.returncode,
           "seconds": seconds}
    if not r or r.get("refused"):
        return {**row, "decision": None, "error": (done.stderr[-1500:] or "no report").strip()}
    rules = {x["name"]: x for x in r["rules"]}
    return {**row, "decision": r["decision"], "rule": r["rule"], "W": r["W"], "G": r["G"], "p": r["p"],
            "se_W": rules["rule 1"]["se"], "df_W": rules["rule 1"]["df"], "se_G": rules["rule 2"]["se"],
            "variance": rules["rule 1"]["variance"], "mde_W": r["mde"]["W"], "mde_G": r["mde"]["G"],
            "training_noise": r["training_noise"][:60]}


def _template(folder: Path) -> str:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()  # runs the migrations
    return str(folder / "mlflow.db")


# ---------------------------------------------------------------- resume, summary, plot


def runs_file() -> Path:
    return RESULTS / "gate_oc_runs.jsonl"


def done_rows() -> list[dict]:
    f = runs_file()
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def run(settings: list[Setting], workers: int, budget_s: float | None, batch: int = 6) -> None:
    have = {(r["setting"], r["world"]) for r in done_rows() if r.get("decision")}
    left = {s.name: [i for i in range(s.n) if (s.name, i) not in have] for s in settings}
    # batch by batch across the settings, so a run cut short leaves every setting about as far along
    tasks = [(s, left[s.name][k:k + batch]) for k in range(0, max(map(len, left.values()), default=0), batch)
             for s in settings if left[s.name][k:k + batch]]
    todo = sum(map(len, left.values()))
    print(f"{todo} worlds to decide ({sum(s.n for s in settings) - todo} done earlier)", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s if budget_s else None
    with tempfile.TemporaryDirectory(prefix="gate-oc-template-") as tdir, open(runs_file(), "a") as out:
        template = _template(Path(tdir))
        with Pool(workers) as pool:
            bar = tqdm(total=todo, desc="worlds", unit="world")
            for rows in pool.imap_unordered(run_worlds, [(s, ws, template) for s, ws in tasks]):
                for row in rows:
                    out.write(json.dumps(row) + "\n")
                out.flush()
                bar.update(len(rows))
                bar.set_postfix(last=rows[-1]["decision"], s_per_world=rows[-1]["seconds"])
                if deadline is not None and time.monotonic() > deadline:
                    pool.terminate()  # what was written stays; the rest is left for the next call
                    break
            bar.close()
    summarize()


def wilson(k: int, n: int) -> tuple[float, float]:
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def summarize() -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for r in done_rows():
        if r.get("decision"):
            groups.setdefault(r["setting"], []).append(r)
    out = []
    for name, rs in sorted(groups.items()):
        s0 = rs[0]
        ships = sum(r["decision"] == "ship_per_horizon" for r in rs)
        lo, hi = wilson(ships, len(rs))
        se = np.array([r["se_W"] for r in rs if r.get("se_W") is not None])
        err = np.array([r["W"] - r["delta"] for r in rs])
        row = {"setting": name, "kind": s0["kind"], "replicates": s0["replicates"], "tau": s0["tau"],
               "delta": s0["delta"], "windows": s0["windows"], "n": len(rs), "ships": ships,
               "rate": ships / len(rs), "wilson95": [lo, hi],
               "by_rule": {k: sum(r["decision"] == "ship_per_horizon" and r["rule"] == k for r in rs)
                           for k in ("rule 1", "rule 2")},
               "decisions": {d: sum(r["decision"] == d for r in rs) for d in sorted({r["decision"] for r in rs})},
               "variance": s0.get("variance"), "W_bias": float(err.mean()),
               "sd_W_over_se": float(err.std(ddof=1) / math.sqrt(np.mean(se ** 2))) if len(se) > 1 else None,
               "median_mde_W": float(np.median([r["mde_W"] for r in rs if r.get("mde_W") is not None] or [math.nan])),
               "median_world_s": float(np.median([r["seconds"] for r in rs]))}
        if row["kind"] == "null":
            row["target"] = f"rate <= {TARGET_FALSE_SHIP}, Wilson upper <= {TARGET_UPPER}, n >= 300"
            row["met"] = row["rate"] <= TARGET_FALSE_SHIP and hi <= TARGET_UPPER and len(rs) >= 300
        elif row["kind"] == "mde":
            # the claim holds where the worlds at δ report δ as their MDE: a sweep's se grows with its lift
            row["reports_its_delta"] = abs(row["median_mde_W"] - row["delta"]) <= 0.1 * row["delta"]
            row["target"] = f"P(ship) at the reported MDE in {list(MDE_BAND)}"
            row["met"] = MDE_BAND[0] <= row["rate"] <= MDE_BAND[1]
        out.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"what": __doc__.split("\n\n")[0], "gate": "installed perception-gate --config local (subprocess)",
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "node": platform.node()},
           "rows": out}
    (RESULTS / "gate_oc.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("| kind | R | τ | δ | n | ships | rate | Wilson 95 % | sd(W−δ)/se | median MDE_W | target met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        ratio = "–" if r["sd_W_over_se"] is None else f"{r['sd_W_over_se']:.2f}"
        print(f"| {r['kind']} | {r['replicates']} | {r['tau']:g} | {r['delta']:g} | {r['n']} | {r['ships']} | "
              f"{r['rate']:.3f} | [{r['wilson95'][0]:.3f}, {r['wilson95'][1]:.3f}] | {ratio} | "
              f"{r['median_mde_W']:.4f} | {r.get('met', '–')} |")
    _plot(out)
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
    ax.set_title("Decision gate: operating characteristic (installed perception-gate, local config)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "gate_oc.png", dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["run", "report"])
    p.add_argument("--plan", default="null", help="null | power | mde")
    p.add_argument("--n", type=int, default=None, help="worlds per setting (default: the plan's)")
    p.add_argument("--workers", type=int, default=2, help="worlds at once (each gate runs single-threaded)")
    p.add_argument("--budget-s", type=float, default=None, help="stop taking results after this many seconds")
    p.add_argument("--match", default="", help="only the plan's settings whose name contains this, e.g. R3-tau0.005")
    args = p.parse_args()
    if args.what == "report":
        summarize()
    else:
        run([s for s in plan(args.plan, args.n) if args.match in s.name], args.workers, args.budget_s)


if __name__ == "__main__":
    main()
