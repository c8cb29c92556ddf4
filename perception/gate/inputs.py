"""The gate's inputs (DESIGN §6, §7): a sweep's six training runs read from MLflow, checked.

The latest FINISHED run per (variant, fold) counts; older duplicates are reported, and every RUNNING
training run it ignores (training now, or left so by a process that died) is listed. Anything that
makes the comparison unsound (a missing run, a missing, non-finite or impossible metric, an AUC the
run's own predictions do not give, missing, unreadable or misaligned predictions, runs that disagree
on data, folds, seed, epochs or code) is collected, all of it, into one `GateRefusal`.
"""

from __future__ import annotations

import ast
import math
import tempfile
import time
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from numpy.typing import DTypeLike
from mlflow.entities import Run, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from perception.arms import DEFAULT_CONTROL, DEFAULT_TREATMENT, RESEED_SUFFIX, arm_names
from perception.contract import (
    AGREED_PARAMS,
    ATTENTION,
    DIAGNOSTICS,
    GPU_UTILIZATION,
    PARAM_DEFAULTS,
    PREDICTIONS,
    REPLICATE,
    ROLE,
    ROLE_SWEEP,
    ROLE_TRAIN,
    SAMPLES_PER_S,
    SEED,
    param,
    tag,
    val_auc,
)
from perception.errors import PerceptionError
from perception.metrics import auc
from perception.paths import check_sweep_id
from perception.run_id import RunId, RunKey as Key

# Runs read at once: each is four requests (two downloads, two metric histories) that mostly wait on
# the server (docs/performance.md, the tracking path under load)
READERS = 8

# How far a logged final-epoch AUC may lie from the AUC of the run's own predictions. The trainer logs
# the AUC of exactly the probabilities it saves; a run resumed after its last checkpoint re-evaluates
# and saves those instead, so a killed and resumed training logs exactly its predictions' AUC
# (docs/design.md §6 "Checkpoints"); 1e-3 leaves room for a re-evaluation on other hardware and still lies an order of
# magnitude under the gate's min_lift (0.01). More is another run's predictions or an edited metric.
AUC_TOLERANCE = 1e-3

# What np.load and reading its arrays raise on a damaged .npz (cut short, not a zip, a bad member) or one
# without a named array: a run's artifact to report, not a gate to crash.
NPZ_ERRORS = (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)
ATTENTION_LEFT_OUT = "; its attention profile is left out of the report"
PREDICTION_ARRAYS: dict[str, DTypeLike] = {"probs": np.float32, "labels": np.uint8, "mask": bool, "index": np.int64}
ATTENTION_ARRAYS: dict[str, DTypeLike] = {"lag_edges": np.int64, "mass": np.float32, "query_names": str}


class GateRefusal(PerceptionError):
    """The runs cannot be compared; `reasons` names every problem found."""

    def __init__(self, reasons: list[str], notes: Optional[list[str]] = None, running: Optional[list[str]] = None):
        super().__init__("; ".join(reasons))
        self.reasons = reasons
        self.notes = notes or []
        self.running = running or []  # the RUNNING training runs ignored, one line each


@dataclass
class Predictions:
    probs: np.ndarray  # (N, H) float32
    labels: np.ndarray  # (N, H) uint8
    mask: np.ndarray  # (N, H) bool
    index: np.ndarray  # (N,) int64 window end, increasing


@dataclass
class Attention:
    lag_edges: np.ndarray  # (n_buckets + 1,) int64
    mass: np.ndarray  # (Q, n_buckets) float32
    query_names: list[str]


@dataclass
class ArmRun:
    run_id: str
    arm: str  # the MLflow tag `variant`
    fold: int
    replicate: int
    final_auc: np.ndarray  # (H,) final-epoch val_auc_h{h}
    samples_per_s: Optional[float]  # median over epochs
    predictions: Predictions
    attention: Optional[Attention]
    diagnostics: dict[str, float]  # final-epoch value of each logged DIAGNOSTICS metric
    params: dict[str, str] = field(default_factory=dict)
    gpu_utilization: Optional[float] = None  # median of MLflow's system/gpu_0_utilization_percentage (%)
    gpu_samples: int = 0  # how many samples that median is of


@dataclass
class SweepInputs:
    sweep_id: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: Optional[str]
    horizons: list[int]
    window: int
    stride: int
    n_folds: int
    params: dict[str, str]  # the agreed values
    runs: dict[Key, ArmRun]
    arms: list[str]  # the arms loaded, control and treatment first
    replicates: list[int]  # the replicate numbers every loaded arm has in every fold
    notes: list[str] = field(default_factory=list)
    parent_tags: dict[str, str] = field(default_factory=dict)
    running: list[str] = field(default_factory=list)  # the RUNNING training runs ignored, one line each

    def run(self, arm: str, fold: int, replicate: int) -> ArmRun:
        return self.runs[(arm, fold, replicate)]

    def arm_runs(self, arm: str) -> list[ArmRun]:
        return [r for (a, _, _), r in sorted(self.runs.items()) if a == arm]


def load_sweep(
    client: MlflowClient,
    tracking_uri: str,
    experiment: str,
    sweep_id: str,
    control: str = DEFAULT_CONTROL,
    treatment: str = DEFAULT_TREATMENT,
    optional_arms: Sequence[str] = (),
    waves: Optional[int] = None,
) -> SweepInputs:
    """The sweep's runs of `control` and `treatment` (required, every fold and replicate) and of each
    of `optional_arms` found complete (the attribution's arms); anything unsound is a GateRefusal.
    With `waves`, only replicates 0 … waves − 1 are read: a sequential study's look as it stood, whatever
    later waves already trained (or left half-trained before a preemption)."""
    check_sweep_id(sweep_id, "--sweep-id")
    try:
        exp = client.get_experiment_by_name(experiment)
    except MlflowException as e:
        raise GateRefusal([f"cannot read experiment {experiment!r} at {tracking_uri}: {e.message}"]) from e
    if exp is None:
        raise GateRefusal([f"experiment {experiment!r} does not exist at {tracking_uri}"])
    runs = _search(client, exp.experiment_id, sweep_id)
    parent = _latest([r for r in runs if r.data.tags.get(ROLE) == ROLE_SWEEP])
    train = [r for r in runs if r.data.tags.get(ROLE) == ROLE_TRAIN and (waves is None or _replicate(r) < waves)]
    if not train:
        raise GateRefusal(
            [f"no training runs (role=train) of sweep {sweep_id!r} in experiment {experiment!r} at {tracking_uri}"]
        )

    notes: list[str] = []
    running = _running(train)
    chosen_all = _choose_latest_finished(sweep_id, train, notes)
    present = {a for a, _, _ in chosen_all}
    arms = [control, treatment] + [a for a in optional_arms if a in present and a not in (control, treatment)]
    chosen = {k: r for k, r in chosen_all.items() if k[0] in arms}
    reasons: list[str] = []
    params = _agreed_params(chosen, reasons)
    if reasons:  # without agreed horizons and folds nothing below is meaningful
        raise GateRefusal(reasons, notes, running)
    horizons = _parse_horizons(params["data.horizons"], reasons)
    n_folds, window, stride = (
        _parse_int(params, k, reasons) for k in ("data.n_folds", "data.window", "data.window_stride")
    )
    if reasons:
        raise GateRefusal(reasons, notes, running)

    replicates = sorted({r for a, _, r in chosen if a in (control, treatment)}) or [0]
    for arm in list(arms):
        missing = _missing_runs(arm, chosen, train, n_folds, replicates)
        if missing and arm not in (control, treatment):  # an incomplete optional arm is left out
            notes += [m + " (left out of the attribution)" for m in missing]
            arms.remove(arm)
        reasons += [] if arm not in arms else missing
    chosen = {k: r for k, r in chosen.items() if k[0] in arms}
    _check_seeds(chosen, reasons)
    for (arm, fold, rep), run in sorted(chosen.items()):
        if fold >= n_folds:
            reasons.append(f"{arm} fold {fold} (run {run.info.run_id}): fold outside data.n_folds = {n_folds}")
        elif run.data.params.get("data.fold", str(fold)) != str(fold):
            reasons.append(
                f"{arm} fold {fold} (run {run.info.run_id}): tag fold={fold} but param "
                f"data.fold={run.data.params['data.fold']}"
            )

    arm_runs: dict[Key, ArmRun] = {}
    todo = [(k, r) for k, r in sorted(chosen.items()) if k[1] < n_folds and k[2] in replicates]
    with tempfile.TemporaryDirectory(prefix="perception-gate-") as tmp, ThreadPoolExecutor(READERS) as pool:
        read = pool.map(lambda kv: _read_run(client, kv[0], kv[1], horizons, Path(tmp)), todo)
        for (key, _), (arm_run, run_reasons, run_notes) in zip(todo, read):  # in order: messages read stably
            reasons += run_reasons
            notes += run_notes
            if arm_run is not None:
                arm_runs[key] = arm_run
    for fold in range(n_folds):
        fold_runs = [
            r for (a, f, _), r in sorted(arm_runs.items(), key=lambda kv: (arms.index(kv[0][0]), kv[0][2])) if f == fold
        ]
        for other in fold_runs[1:]:
            _check_aligned(fold_runs[0], other, reasons)
    if reasons:
        raise GateRefusal(reasons, notes, running)
    return SweepInputs(
        sweep_id,
        tracking_uri,
        exp.experiment_id,
        parent.info.run_id if parent else None,
        horizons,
        window,
        stride,
        n_folds,
        params,
        arm_runs,
        arms,
        replicates,
        notes,
        dict(parent.data.tags) if parent else {},
        running,
    )


def _read_run(
    client: MlflowClient, key: Key, run: Run, horizons: list[int], tmp: Path
) -> tuple[Optional[ArmRun], list[str], list[str]]:
    """One run's metrics and artifacts, checked: (the run or None, its reasons, its notes)."""
    arm, fold, rep = key
    reasons: list[str] = []
    notes: list[str] = []
    where = f"{arm} fold {fold}" + (f" replicate {rep}" if rep else "") + f" (run {run.info.run_id})"
    final_auc = _final_aucs(run, horizons, where, reasons)
    preds = _load_predictions(client, run, horizons, tmp, where, reasons)
    attention = _load_attention(client, run, tmp, where, notes)
    if final_auc is None or preds is None:
        return None, reasons, notes
    _check_logged_auc(final_auc, preds, horizons, where, reasons)
    diagnostics = {k: run.data.metrics[k] for k in DIAGNOSTICS if k in run.data.metrics}
    gpu = _finite_history(client, run, GPU_UTILIZATION)
    return (
        ArmRun(
            run.info.run_id,
            arm,
            fold,
            rep,
            final_auc,
            _median_metric(client, run, SAMPLES_PER_S),
            preds,
            attention,
            diagnostics,
            dict(run.data.params),
            _median(gpu),
            len(gpu),
        ),
        reasons,
        notes,
    )


# ---------------------------------------------------------------- runs


def find_parent_run(client: MlflowClient, experiment_id: str, sweep_id: str) -> Optional[str]:
    """The sweep's parent run (role=sweep), the latest if several."""
    parent = _latest([r for r in _search(client, experiment_id, sweep_id) if r.data.tags.get(ROLE) == ROLE_SWEEP])
    return parent.info.run_id if parent else None


def _search(client: MlflowClient, experiment_id: str, sweep_id: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.sweep_id = '{sweep_id}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _latest(runs: list[Run]) -> Optional[Run]:
    return max(runs, key=lambda r: (r.info.end_time or 0, r.info.start_time or 0), default=None)


def _missing_runs(arm: str, chosen: dict[Key, Run], train: list[Run], n_folds: int, replicates: list[int]) -> list[str]:
    out = []
    for fold in range(n_folds):
        have = {r for a, f, r in chosen if a == arm and f == fold}
        for rep in (r for r in replicates if r not in have):
            found = [
                f"{r.info.status} {r.info.run_id}"
                for r in train
                if r.data.tags.get("variant") == arm and r.data.tags.get("fold") == str(fold) and _replicate(r) == rep
            ]
            where = f"{arm} fold {fold}" + (f" replicate {rep}" if len(replicates) > 1 or rep else "")
            out.append(
                f"{where}: no FINISHED run"
                + (f" (found {', '.join(found)})" if found else "")
                + (f"; the arms' replicate sets differ in fold {fold}" if have else "")
            )
    return out


def _replicate(run: Run) -> int:
    value = tag(run.data.tags, REPLICATE) or ""  # never None: the tag has a default
    return int(value) if value.isdigit() else -1


def _choose_latest_finished(sweep_id: str, train: list[Run], notes: list[str]) -> dict[Key, Run]:
    known = set(arm_names())
    groups: dict[Key, list[Run]] = {}
    for r in train:
        arm, fold, rep = r.data.tags.get("variant"), r.data.tags.get("fold", ""), _replicate(r)
        if arm not in known or not fold.isdigit() or rep < 0:
            notes.append(
                f"run {r.info.run_id}: ignored, tags variant={arm!r} fold={fold!r} "
                f"replicate={r.data.tags.get('replicate')!r} (expected an arm of {sorted(known)}, "
                f"a fold number and a replicate number)"
            )
            continue
        if r.info.status != "FINISHED":
            notes.append(f"{arm} fold {fold}: run {r.info.run_id} ignored, status {r.info.status}")
            continue
        groups.setdefault(RunId(sweep_id, arm, int(fold), rep).key, []).append(r)
    chosen: dict[Key, Run] = {}
    for key, rs in groups.items():
        latest = _latest(rs)
        assert latest is not None  # every group holds a run
        chosen[key] = latest
        older = [r.info.run_id for r in rs if r is not chosen[key]]
        if older:
            notes.append(
                f"duplicate runs for {key[0]} fold {key[1]}"
                + (f" replicate {key[2]}" if key[2] else "")
                + f": using the latest finished {chosen[key].info.run_id}, ignoring {', '.join(older)}"
            )
    return chosen


def _running(train: list[Run]) -> list[str]:
    """A RUNNING run is ignored: it is training now, or its process died before it could end it (the
    run's next start continues it)."""
    out = []
    for r in sorted((r for r in train if r.info.status == "RUNNING"), key=lambda r: r.info.start_time or 0):
        tags, rep = r.data.tags, tag(r.data.tags, REPLICATE)
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime((r.info.start_time or 0) / 1000))
        out.append(
            f"{tags.get('variant')} fold {tags.get('fold')}"
            + (f" replicate {rep}" if rep != "0" else "")
            + f": run {r.info.run_id}, RUNNING since {started}"
        )
    return out


def _label(key: Key) -> str:
    arm, fold, rep = key
    return f"{arm} f{fold}" + (f" r{rep}" if rep else "")


def _agreed_params(chosen: dict[Key, Run], reasons: list[str]) -> dict[str, str]:
    agreed = {}
    for key in (*AGREED_PARAMS, *PARAM_DEFAULTS):
        values: dict[str, list[str]] = {}
        for k, run in sorted(chosen.items()):
            value = param(run.data.params, key)
            if value is None:
                reasons.append(f"{k[0]} fold {k[1]} (run {run.info.run_id}): param {key} is missing")
                continue
            values.setdefault(value, []).append(_label(k))
        if len(values) > 1:
            listing = "; ".join(f"{v!r} in {', '.join(who)}" for v, who in values.items())
            reasons.append(f"runs disagree on {key}: {listing}")
        elif values:
            agreed[key] = next(iter(values))
    return agreed


def _check_seeds(chosen: dict[Key, Run], reasons: list[str]) -> None:
    """The arms of one (fold, replicate) share the seed (trunk init and batch order); cells differ
    (`run_id.run_seed`). A reseeded A/A arm (`<arm>_reseed`) trains from another seed by design."""
    by_cell: dict[tuple[int, int], dict[str, list[str]]] = {}
    for k, run in sorted(chosen.items()):
        seed = run.data.params.get(SEED)
        if seed is None:
            reasons.append(f"{k[0]} fold {k[1]} (run {run.info.run_id}): param {SEED} is missing")
            continue
        if k[0].endswith(RESEED_SUFFIX):
            continue
        by_cell.setdefault((k[1], k[2]), {}).setdefault(seed, []).append(_label(k))
    for (fold, rep), values in sorted(by_cell.items()):
        if len(values) > 1:
            listing = "; ".join(f"{v!r} in {', '.join(who)}" for v, who in values.items())
            where = f"fold {fold}" + (f" replicate {rep}" if rep or any(r for _, r in by_cell) else "")
            reasons.append(f"runs disagree on seed: {listing} (within {where})")


def _parse_horizons(text: str, reasons: list[str]) -> list[int]:
    try:
        value = ast.literal_eval(text)
        if isinstance(value, (list, tuple)) and value and all(isinstance(h, int) and h > 0 for h in value):
            return [int(h) for h in value]
    except (ValueError, SyntaxError):
        pass
    reasons.append(f"param data.horizons = {text!r}: expected a list of positive integers like '[30, 100]'")
    return []


def _parse_int(params: dict[str, str], key: str, reasons: list[str]) -> int:
    try:
        value = int(params[key])
        if value > 0:
            return value
    except ValueError:
        pass
    reasons.append(f"param {key} = {params[key]!r}: expected a positive integer")
    return 0


# ---------------------------------------------------------------- metrics and artifacts


def _final_aucs(run: Run, horizons: list[int], where: str, reasons: list[str]) -> Optional[np.ndarray]:
    """MLflow's latest value of a metric is the one at the largest step: the final epoch. An AUC lies
    in [0, 1]; MLflow stores +inf as 1.8e308, so a range check catches that too."""
    out, ok = [], True
    for h in horizons:
        value = run.data.metrics.get(val_auc(h))
        if value is None or not math.isfinite(value):
            reasons.append(f"{where}: metric {val_auc(h)} is {'missing' if value is None else value}")
            ok = False
        elif not 0.0 <= value <= 1.0:
            reasons.append(
                f"{where}: metric {val_auc(h)} is {value:.6g}, outside [0, 1]"
                + (" (MLflow's stored +inf)" if value >= 1e308 else "")
            )
            ok = False
        out.append(value)
    return np.asarray(out, dtype=np.float64) if ok else None


def _check_logged_auc(
    final_auc: np.ndarray, preds: Predictions, horizons: list[int], where: str, reasons: list[str]
) -> None:
    """The logged final-epoch AUC must be the AUC of the predictions the gate decides on."""
    for j, h in enumerate(horizons):
        valid = preds.mask[:, j]
        recomputed = auc(preds.probs[valid, j], preds.labels[valid, j])
        gap = abs(recomputed - final_auc[j])
        if not gap <= AUC_TOLERANCE:  # also when the predictions give no AUC (NaN)
            reasons.append(
                f"{where}: logged {val_auc(h)} = {final_auc[j]:.6f} but the AUC of {PREDICTIONS} "
                f"is {recomputed:.6f} (|difference| {gap:.6f} > tolerance {AUC_TOLERANCE:g}): "
                f"the metric and the predictions are not of one evaluation"
            )


def _finite_history(client: MlflowClient, run: Run, key: str) -> list[float]:
    return [m.value for m in client.get_metric_history(run.info.run_id, key) if math.isfinite(m.value)]


def _median(values: list[float]) -> Optional[float]:
    return float(np.median(values)) if values else None


def _median_metric(client: MlflowClient, run: Run, key: str) -> Optional[float]:
    return _median(_finite_history(client, run, key))


def _download(client: MlflowClient, run: Run, path: str, tmp: Path) -> Optional[Path]:
    dst = tmp / run.info.run_id
    dst.mkdir(exist_ok=True)
    try:
        return Path(client.download_artifacts(run.info.run_id, path, str(dst)))
    except (MlflowException, OSError):
        return None


def _load_predictions(
    client: MlflowClient, run: Run, horizons: list[int], tmp: Path, where: str, reasons: list[str]
) -> Optional[Predictions]:
    arrays = _npz_arrays(client, run, PREDICTIONS, PREDICTION_ARRAYS, tmp, where, reasons)
    if arrays is None:
        return None
    n, h = len(arrays["index"]), len(horizons)
    for key in ("probs", "labels", "mask"):
        if arrays[key].shape != (n, h):
            reasons.append(
                f"{where}: {PREDICTIONS} {key} has shape {arrays[key].shape}, expected ({n}, {h}) "
                f"(N windows x the {h} horizons {horizons})"
            )
            return None
    index, mask, probs = arrays["index"], arrays["mask"], arrays["probs"]
    if index.ndim != 1 or len(np.unique(index)) != n:
        reasons.append(f"{where}: {PREDICTIONS} index must be one distinct window end per row")
        return None
    if not np.isfinite(probs[mask]).all():
        reasons.append(f"{where}: {PREDICTIONS} probs has non-finite values at unmasked windows")
        return None
    if not ((probs[mask] >= 0) & (probs[mask] <= 1)).all():
        reasons.append(
            f"{where}: {PREDICTIONS} probs has values outside [0, 1] at unmasked windows "
            f"(min {probs[mask].min():.6g}, max {probs[mask].max():.6g})"
        )
        return None
    order = np.argsort(index, kind="stable")  # time order: the block bootstrap needs it
    return Predictions(probs[order], arrays["labels"][order], mask[order], index[order])


def _load_attention(client: MlflowClient, run: Run, tmp: Path, where: str, notes: list[str]) -> Optional[Attention]:
    arrays = _npz_arrays(client, run, ATTENTION, ATTENTION_ARRAYS, tmp, where, notes, ATTENTION_LEFT_OUT)
    if arrays is None:
        return None
    return Attention(arrays["lag_edges"], arrays["mass"], [str(q) for q in arrays["query_names"]])


def _npz_arrays(
    client: MlflowClient,
    run: Run,
    artifact: str,
    fields: dict[str, DTypeLike],
    tmp: Path,
    where: str,
    said: list[str],
    consequence: str = "",
) -> Optional[dict[str, np.ndarray]]:
    """The run's .npz `artifact`'s arrays named in `fields`, each as its dtype there; None, with a line in
    `said` (ending in `consequence`), when the run has no such file, it is damaged, or an array is absent or
    of another kind."""
    path = _download(client, run, artifact, tmp)
    if path is None or not path.is_file():
        said.append(f"{where}: artifact {artifact} is missing{consequence}")
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k].astype(dtype) for k, dtype in fields.items()}
    except NPZ_ERRORS as e:
        said.append(
            f"{where}: {artifact} is unreadable or lacks {'/'.join(fields)} ({type(e).__name__}: {e}){consequence}"
        )
        return None


def _check_aligned(a: ArmRun, b: ArmRun, reasons: list[str]) -> None:
    pa, pb = a.predictions, b.predictions
    head = f"fold {a.fold}: predictions of {a.arm} (run {a.run_id}) and {b.arm} (run {b.run_id})"
    if len(pa.index) != len(pb.index):
        reasons.append(f"{head} are not aligned: {len(pa.index)} vs {len(pb.index)} windows")
    elif not np.array_equal(pa.index, pb.index):
        first = int(np.flatnonzero(pa.index != pb.index)[0])
        reasons.append(
            f"{head} are not aligned by index: first difference at row {first} ({pa.index[first]} vs {pb.index[first]})"
        )
    elif not np.array_equal(pa.mask, pb.mask) or not np.array_equal(pa.labels[pa.mask], pb.labels[pb.mask]):
        reasons.append(f"{head} share the index but not the labels/mask: not the same validation windows")
