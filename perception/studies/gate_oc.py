"""The gate's operating-characteristic worlds (studies/gate_oc.py, studies/gate_oc_sequential.py): prediction-level
worlds with a planted true lift, written to an MLflow store as trainings log them and decided by the installed
`perception-gate` or by the gate's own functions in process, and the summary of what they decided.

A world has 2 arms x 3 folds x R replicates at the `local` scale (horizons 10 ... 1000, window 128, stride 16),
N validation windows a fold. Labels and prediction noise are moving averages over the windows a window shares
its snapshots with, so neighbouring windows are nearly the same sample, as the product's overlapping windows
are. A cell's score is μ·y + noise of unit variance (shared by the arms and replicates of a fold, plus each run's
own), so its population AUC is Φ(μ/√2): arm A sits at BASE_AUC, arm B at BASE_AUC + δ on the weighted horizon
(h1000) and equal elsewhere, and every (arm, fold, replicate) cell is moved by a training effect of sd τ per
horizon. Every world has its own seed; nothing is reused between worlds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.stats import binomtest, norm

HORIZONS = (10, 30, 100, 300, 1000)
WEIGHTED = 1000  # conf/gate/local.yaml: h1000 weighs 1; shift horizons 10, 30
BASE_AUC = (0.60, 0.58, 0.56, 0.55, 0.54)
WINDOW, STRIDE = 128, 16
TARGET_FALSE_SHIP, TARGET_UPPER = 0.05, 0.075
MDE_BAND = (0.7, 0.9)
MDE_SETTINGS = ((3, 0.005), (2, 0.015), (1, 0.005))  # (R, τ) where the power claim is checked


@dataclass(frozen=True)
class Setting:
    replicates: int
    tau: float  # sd of a cell's training effect on its AUC, per horizon
    delta: float  # planted true AUC difference B − A at the weighted horizon
    n: int  # worlds
    windows: int = 2000  # validation windows a fold (28 blocks of 71 at h1000)
    shared: float = 0.7  # share of a run's prediction-noise variance common to the fold's runs
    kind: str = "null"  # "null" | "power" | "mde"
    fold_sd: float = 0.0  # sd of a fold-by-arm difference per horizon, the same for every replicate of a fold

    @property
    def name(self) -> str:
        folds = f"-fold{self.fold_sd:g}" if self.fold_sd else ""
        return f"{self.kind}-R{self.replicates}-tau{self.tau:g}-d{self.delta:.4f}-N{self.windows}{folds}"


def plan(name: str, n: int | None, rows: Sequence[dict] = ()) -> list[Setting]:
    """The settings of a plan; the mde plan plants the median MDE of the null worlds among `rows`."""
    if name == "null":
        return [Setting(r, tau, 0.0, n or 300) for r in (1, 2, 3) for tau in (0.005, 0.015)]
    if name == "power":
        return [
            Setting(r, tau, d, n or 60, kind="power")
            for r, tau in ((3, 0.005), (3, 0.015), (1, 0.005))
            for d in (0.005, 0.01, 0.02, 0.04)
        ]
    if name == "mde":  # δ = the median MDE the gate reports for this setting's null worlds
        return [Setting(r, tau, mde_of_null(rows, r, tau), n or 300, kind="mde") for r, tau in MDE_SETTINGS]
    raise SystemExit(f"unknown plan {name!r}: expected null, power or mde")


def mde_of_null(rows: Sequence[dict], replicates: int, tau: float) -> float:
    """The median minimum detectable W over the null worlds of (R, τ) among `rows` (a world decided twice, by the
    installed gate and in process, counts once: the same world by name)."""
    unique = {(row["setting"], row["world"]): row for row in rows}
    null = [
        row
        for row in unique.values()
        if row["kind"] == "null"
        and row["replicates"] == replicates
        and row["tau"] == tau
        and row.get("se_W") is not None
    ]
    if len(null) < 100:
        raise SystemExit(f"{len(null)} null worlds at R = {replicates}, τ = {tau}: run --plan null first (100 or more)")
    return round(float(np.median(current_mde_W(null))), 4)


def planned_mde(rows: Sequence[dict], replicates: int, tau: float) -> float | None:
    """The δ the mde plan plants now at (R, τ); None where it plants none."""
    if (replicates, tau) not in MDE_SETTINGS:
        return None
    try:
        return mde_of_null(rows, replicates, tau)
    except SystemExit:  # too few null worlds yet
        return None


def current_mde_W(rows: list[dict]) -> list[float]:
    """Rule 1's minimum detectable W of each world as the installed gate computes it now from the world's
    se and degrees of freedom (perception.gate.evidence at α/2, min_lift of conf/gate/local.yaml), so rows
    decided before a change of the MDE's formula alone (not of the decision) still count."""
    from perception.gate.config import load_gate_config
    from perception.gate.evidence import minimum_detectable

    cfg = load_gate_config("local")
    return [
        minimum_detectable(r["se_W"], math.inf if r.get("df_W") is None else r["df_W"], cfg.alpha / 2, cfg.min_lift)
        for r in rows
        if r.get("se_W") is not None
    ]


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
    cells: dict[tuple[str, int, int], dict[str, np.ndarray]] = {}
    for fold in range(folds):
        # a label looks h snapshots ahead: windows closer than h / stride share its future
        y = np.stack([_moving_average(rng, n, max(1, h // STRIDE)) > 0 for h in HORIZONS], axis=1)  # (n, H)
        common = np.stack([_moving_average(rng, n, WINDOW // STRIDE) for _ in HORIZONS], axis=1)  # (n, H)
        mask = np.ones((n, hz), dtype=bool)
        for j, h in enumerate(HORIZONS):
            mask[n - max(1, h // STRIDE) :, j] = False  # labels past the fold's end do not exist
        index = fold * 1_000_000 + WINDOW + STRIDE * np.arange(n, dtype=np.int64)
        # a difference between the arms that this fold has and no replicate changes (none by default)
        fold_effect = s.fold_sd * rng.normal(size=hz) if s.fold_sd else 0.0 * planted
        for rep in range(s.replicates):
            for arm, lift in (("shared", 0.0 * planted), ("per_horizon", planted + fold_effect)):
                auc = np.asarray(BASE_AUC) + lift + s.tau * rng.normal(size=hz)  # the cell's training effect
                own = np.stack([_moving_average(rng, n, WINDOW // STRIDE) for _ in HORIZONS], axis=1)
                score = separation(auc) * y + math.sqrt(s.shared) * common + math.sqrt(1 - s.shared) * own
                cells[(arm, fold, rep)] = {
                    "probs": (1 / (1 + np.exp(-score))).astype(np.float32),
                    "labels": y.astype(np.uint8),
                    "mask": mask,
                    "index": index,
                }
    return cells


def world_seed(s: Setting, i: int) -> int:
    """Its own seed per setting and world: no two settings share a world's draws."""
    return zlib.crc32(s.name.encode()) * 100_003 + i


# ---------------------------------------------------------------- deciding them


def gate_command() -> str:
    here = Path(sys.executable).parent / "perception-gate"
    return str(here) if here.is_file() else "perception-gate"


def run_worlds(task: tuple[Setting, list[int], str]) -> list[dict]:
    """Worlds i of one setting, each its own sweep in one fresh store, decided by one call of the
    installed gate (repeated --sweep-id: each decided as if alone, one import of the gate for all)."""
    s, worlds, template = task  # template: migrated_store's
    from mlflow.tracking import MlflowClient

    from perception.testing.sweep_store import SweepSpec, log_sweep  # runs logged exactly as trainings log them

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gate-oc-") as folder:
        tmp = Path(folder)
        shutil.copy(template, tmp / "mlflow.db")  # a migrated empty store: no migrations per world
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        client.create_experiment("perception-ab", artifact_location=(tmp / "artifacts").as_uri())
        for i in worlds:
            spec = SweepSpec(
                mu_a=[0.0] * 5,
                mu_b=[0.0] * 5,
                horizons=list(HORIZONS),
                n_windows=s.windows,
                window=WINDOW,
                stride=STRIDE,
                epochs=2,
                seed=world_seed(s, i),
                replicates=s.replicates,
            )
            log_sweep(client, f"oc-{i}", spec, world_cells(s, world_seed(s, i)), attention=False)  # decisions only
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        ids = [a for i in worlds for a in ("--sweep-id", f"oc-{i}")]
        done = subprocess.run(
            [
                gate_command(),
                *ids,
                "--tracking-uri",
                uri,
                "--config",
                "local",
                "--out",
                str(tmp / "report"),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        # one --sweep-id writes its report into --out itself, several each into --out/<sweep_id>
        reports = {i: tmp / "report" / (f"oc-{i}" if len(worlds) > 1 else "") / "report.json" for i in worlds}
        decided = {i: json.loads(f.read_text()) for i, f in reports.items() if f.is_file()}
    seconds = round((time.perf_counter() - t0) / len(worlds), 2)
    return [_row(s, i, done.returncode, done.stderr, decided.get(i, {}), seconds) for i in worlds]


def decide_in_process(task: tuple[Setting, list[int], str]) -> list[dict]:
    """The same worlds decided by the gate's own functions in this process (perception.gate.decision:
    resample, decide; conf/gate/local.yaml): no MLflow store and no subprocess, ~5x faster, for
    simulations too large for the installed gate on a small machine. The installed gate stays the measure."""
    from perception.gate import stats
    from perception.gate.config import load_gate_config
    from perception.gate.decision import decide, resample
    from perception.gate.inputs import ArmRun, Predictions, SweepInputs

    s, worlds, _ = task
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
            )  # (H,) what a training logs as val_auc_h{h}
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
        inputs = SweepInputs(
            f"oc-{i}",
            "",
            "",
            None,
            list(HORIZONS),
            WINDOW,
            STRIDE,
            3,
            {},
            runs,
            ["shared", "per_horizon"],
            list(range(s.replicates)),
        )
        g = decide(inputs, cfg, "shared", "per_horizon", resample(inputs, cfg, progress=False))
        r = {
            "decision": g.decision,
            "rule": g.rule,
            "W": g.W,
            "G": g.G,
            "p": g.p,
            "rules": [vars(x) for x in g.rules],
            "mde": g.mde,
            "training_noise": g.training_noise,
        }
        rows.append(_row(s, i, 0, "", r, round(time.perf_counter() - t0, 2)))
    return rows


def _row(s: Setting, i: int, returncode: int, stderr: str, r: dict, seconds: float) -> dict:
    row = {
        "setting": s.name,
        **asdict(s),
        "world": i,
        "seed": world_seed(s, i),
        "returncode": returncode,
        "seconds": seconds,
    }
    if not r or r.get("refused"):
        return {**row, "decision": None, "error": (stderr[-1500:] or "no report").strip()}
    rules = {x["name"]: x for x in r["rules"]}
    finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731  (as report.json has them)
    numbers = {
        "W": r["W"],
        "G": r["G"],
        "p": r["p"],
        "se_W": rules["rule 1"]["se"],
        "df_W": rules["rule 1"]["df"],
        "p_W": rules["rule 1"]["p_bootstrap"],
        "se_G": rules["rule 2"]["se"],
        "df_G": rules["rule 2"]["df"],
        "p_G": rules["rule 2"]["p_bootstrap"],
        "mde_W": r["mde"]["W"],
        "mde_G": r["mde"]["G"],
    }
    return {
        **row,
        "decision": r["decision"],
        "rule": r["rule"],
        **{k: finite(v) for k, v in numbers.items()},
        "variance": rules["rule 1"]["variance"],
        "training_noise": r["training_noise"][:60],
    }


def migrated_store(folder: Path) -> str:
    """An empty MLflow store with its migrations run, to copy for each batch of worlds."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()  # runs the migrations
    return str(folder / "mlflow.db")


# ---------------------------------------------------------------- what they decided


def decided_rows(rows: list[dict]) -> list[dict]:
    """The first decision of each (setting, world): a world decided twice (two runs at once) counts once."""
    first: dict[tuple[str, int], dict] = {}
    for r in rows:
        if r.get("decision"):
            first.setdefault((r["setting"], r["world"]), r)
    return list(first.values())


def interleaved_batches(
    settings: list[Setting], left: dict[str, list[int]], batch: int
) -> list[tuple[Setting, list[int]]]:
    """Batch by batch across the settings, so a run cut short leaves every setting about as far along."""
    return [
        (s, left[s.name][k : k + batch])
        for k in range(0, max(map(len, left.values()), default=0), batch)
        for s in settings
        if left[s.name][k : k + batch]
    ]


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of k / n (scipy's)."""
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def summarize(rows: list[dict], null_rows: list[dict] | None = None) -> list[dict]:
    """Per setting of the worlds `rows` decided: ships with their Wilson interval against the targets, W's bias,
    sd(W − δ) against the gate's se, the median MDE. An mde row is checked against the δ the mde plan plants now
    from the null worlds among `null_rows` (default: `rows`)."""
    groups: dict[str, list[dict]] = {}
    for r in decided_rows(rows):
        groups.setdefault(r["setting"], []).append(r)
    out = []
    for name, rs in sorted(groups.items()):
        s0 = rs[0]
        ships = sum(r["decision"] == "ship_per_horizon" for r in rs)
        lo, hi = wilson(ships, len(rs))
        se = np.array([r["se_W"] for r in rs if r.get("se_W") is not None])
        err = np.array([r["W"] - r["delta"] for r in rs])
        row = {
            "setting": name,
            "kind": s0["kind"],
            "replicates": s0["replicates"],
            "tau": s0["tau"],
            "delta": s0["delta"],
            "windows": s0["windows"],
            "n": len(rs),
            "ships": ships,
            "rate": ships / len(rs),
            "wilson95": [lo, hi],
            "by_rule": {
                k: sum(r["decision"] == "ship_per_horizon" and r["rule"] == k for r in rs) for k in ("rule 1", "rule 2")
            },
            "decisions": {d: sum(r["decision"] == d for r in rs) for d in sorted({r["decision"] for r in rs})},
            "variance": s0.get("variance"),
            "W_bias": float(err.mean()),
            "sd_W_over_se": float(err.std(ddof=1) / math.sqrt(np.mean(se**2))) if len(se) > 1 else None,
            "median_mde_W": float(np.median(current_mde_W(rs) or [math.nan])),
            "median_world_s": float(np.median([r["seconds"] for r in rs])),
        }
        if row["kind"] == "null":
            row["target"] = f"rate <= {TARGET_FALSE_SHIP}, Wilson upper <= {TARGET_UPPER}, n >= 300"
            row["met"] = row["rate"] <= TARGET_FALSE_SHIP and hi <= TARGET_UPPER and len(rs) >= 300
        elif row["kind"] == "mde" and row["delta"] != planned_mde(
            rows if null_rows is None else null_rows, row["replicates"], row["tau"]
        ):
            row["target"] = "none: δ of an earlier plan or MDE formula (a point of the power curve)"
        elif row["kind"] == "mde":
            # δ came from the null worlds; the worlds at δ should report about the same (se shrinks a little with δ)
            row["reports_its_delta"] = abs(row["median_mde_W"] - row["delta"]) <= 0.1 * row["delta"]
            row["target"] = f"P(ship) at the reported MDE in {list(MDE_BAND)}"
            row["met"] = MDE_BAND[0] <= row["rate"] <= MDE_BAND[1]
        out.append(row)
    return out


def cell_lifts(task: tuple[Setting, list[int]]) -> list[list]:
    """Per world: the (F, R, H) final-AUC differences B − A of its cells, as the gate's cells are."""
    from perception.gate import stats

    s, worlds = task
    out = []
    for i in worlds:
        cells = world_cells(s, world_seed(s, i))
        lift = np.zeros((3, s.replicates, len(HORIZONS)))
        for (arm, fold, rep), c in cells.items():
            sign = 1.0 if arm == "per_horizon" else -1.0
            lift[fold, rep] += sign * np.array(
                [
                    stats.auc(c["probs"][c["mask"][:, j], j], c["labels"][c["mask"][:, j], j])
                    for j in range(len(HORIZONS))
                ]
            )
        out.append(lift.tolist())
    return out
