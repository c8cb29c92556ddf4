"""Builds sweeps in a real MLflow store exactly as the trainings log them (DESIGN §6), for the tests, the gate's
speed benchmark and the gate's operating-characteristic studies: a parent run
(role=sweep), six nested training runs with params, per-epoch metrics and the predictions and
attention artifacts. Scores are Gaussian, so each arm's AUC per horizon is set by its separation μ
(AUC ≈ Φ(μ/√2)); the arms share most of their noise, so Δ is precise at a few thousand windows."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from perception.metrics import auc
from perception.run_id import run_seed

VARIANTS = ("shared", "per_horizon")
CI_HORIZONS = [2, 5, 10, 20, 40]


@dataclass
class SweepSpec:
    mu_a: list[float]  # separation per horizon, arm A (shared)
    mu_b: list[float]  # arm B (per_horizon)
    horizons: list[int] = field(default_factory=lambda: list(CI_HORIZONS))
    n_windows: int = 1500  # per fold
    window: int = 32
    stride: int = 4
    epochs: int = 2
    seed: int = 0
    own_noise: float = 0.3  # each arm's own noise, beside the shared noise of scale 1
    episodes: Optional[list[list[int]]] = None  # per fold, B's advantage sign per equal episode
    episode_effect: float = 0.0
    samples_per_s: tuple[float, float] = (1000.0, 900.0)
    skip: set = field(default_factory=set)  # {(variant, fold)} never logged
    nan_metric: Optional[tuple[str, int, int]] = None  # (variant, fold, horizon)
    misalign_fold: Optional[int] = None  # B's index shifted by one stride in this fold
    param_override: dict = field(default_factory=dict)  # {(variant, fold): {param: value}}
    duplicate: Optional[tuple[str, int]] = None  # an older finished run + a running one
    no_predictions: Optional[tuple[str, int]] = None
    extra_arms: dict = field(default_factory=dict)  # {arm: separation per horizon}, e.g. shared_skip
    replicates: int = 1  # replicate r: seed + r, the fold's windows and labels, its own model noise
    replicate_effect: float = 0.0  # B's separation moves by this x (+1, -1, ...) across replicates
    skip_replicate: Optional[tuple[str, int, int]] = None  # (arm, fold, replicate) never logged
    extra_params: dict = field(default_factory=dict)  # logged by every run
    diagnostics: dict = field(default_factory=dict)  # {arm: {metric: final-epoch value}}

    def arms(self) -> dict[str, list[float]]:
        return {VARIANTS[0]: self.mu_a, VARIANTS[1]: self.mu_b, **self.extra_arms}


def fold_predictions(spec: SweepSpec, fold: int, replicate: int = 0) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng([spec.seed, fold, 7])
    n, h = spec.n_windows, len(spec.horizons)
    y = (rng.random((n, h)) < 0.5).astype(np.uint8)
    shared = rng.normal(size=(n, h))
    index = fold * 100_000 + spec.window + spec.stride * np.arange(n, dtype=np.int64)
    mask = np.ones((n, h), dtype=bool)
    for j, hz in enumerate(spec.horizons):  # labels past the fold's last snapshot do not exist
        mask[n - max(1, hz // spec.stride) :, j] = False
    advantage = np.zeros(n)
    if spec.episodes is not None:
        signs = np.asarray(spec.episodes[fold], dtype=float)
        advantage = np.repeat(signs, int(np.ceil(n / len(signs))))[:n] * spec.episode_effect
    out: dict[str, dict[str, np.ndarray]] = {}
    if replicate:  # the same windows, labels and shared noise; other trained models
        rng = np.random.default_rng([spec.seed, fold, 7, replicate])
    swing = spec.replicate_effect * (1 if replicate % 2 == 0 else -1)
    for arm, mu in spec.arms().items():
        separation = np.asarray(mu) + (swing if arm == VARIANTS[1] else 0.0)
        score = separation * y + shared + spec.own_noise * rng.normal(size=(n, h))
        if arm == VARIANTS[1]:
            score = score + advantage[:, None] * (2.0 * y - 1.0)
        probs = (1.0 / (1.0 + np.exp(-score))).astype(np.float32)
        out[arm] = {"probs": probs, "labels": y, "mask": mask, "index": index.copy()}
    if spec.misalign_fold == fold:
        out[VARIANTS[1]]["index"] = index + spec.stride
    return out


def new_store(root: Path) -> tuple[str, MlflowClient]:
    """A local sqlite store with the experiment's artifacts under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("perception-ab", artifact_location=(root / "artifacts").as_uri())
    return uri, client


def _experiment_id(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        raise ValueError(f"the store has no MLflow experiment {name!r} (new_store creates perception-ab)")
    return found.experiment_id


@contextmanager
def _sweep(client: MlflowClient, sweep_id: str, spec: SweepSpec, experiment: str) -> Iterator[Callable[..., str]]:
    """The sweep's parent run (role=sweep), open while its training runs are logged: yields
    log(variant, fold, pred, **log_run's options) -> run_id; the parent ends when the block does."""
    exp_id = _experiment_id(client, experiment)
    parent = client.create_run(exp_id, tags={"role": "sweep", "sweep_id": sweep_id}, run_name=sweep_id)
    with tempfile.TemporaryDirectory() as tmp:
        yield partial(log_run, client, exp_id, parent.info.run_id, sweep_id, spec, tmp=Path(tmp))
    client.set_terminated(parent.info.run_id)


def build_sweep(client: MlflowClient, sweep_id: str, spec: SweepSpec, experiment: str = "perception-ab") -> dict:
    """Logs the sweep; returns {(variant, fold): run_id} of the runs the gate should pick."""
    chosen = {}
    with _sweep(client, sweep_id, spec, experiment) as log:
        for fold, rep in ((f, r) for f in range(3) for r in range(spec.replicates)):
            preds = fold_predictions(spec, fold, rep)
            for variant in spec.arms():
                if (variant, fold) in spec.skip or spec.skip_replicate == (variant, fold, rep):
                    continue
                if rep:
                    log(variant, fold, preds[variant], replicate=rep)
                    continue
                if spec.duplicate == (variant, fold):
                    log(variant, fold, preds[variant], auc_shift=-0.05)
                    time.sleep(0.01)  # a strictly later end time for the run that counts
                chosen[(variant, fold)] = log(variant, fold, preds[variant])
                if spec.duplicate == (variant, fold):
                    log(variant, fold, preds[variant], finish=False)
    return chosen


def log_sweep(
    client: MlflowClient,
    sweep_id: str,
    spec: SweepSpec,
    cells: dict[tuple[str, int, int], dict[str, np.ndarray]],
    experiment: str = "perception-ab",
    attention: bool = True,
) -> None:
    """Logs a sweep of given predictions, {(variant, fold, replicate): npz fields}, as build_sweep does
    (without diagnostics/attention_by_lag.npz when `attention` is false: runs may lack it)."""
    with _sweep(client, sweep_id, spec, experiment) as log:
        for (variant, fold, rep), pred in sorted(cells.items()):
            log(variant, fold, pred, replicate=rep, attention=attention)


def log_run(
    client,
    exp_id,
    parent_id,
    sweep_id,
    spec,
    variant,
    fold,
    pred,
    tmp: Path,
    auc_shift: float = 0.0,
    finish: bool = True,
    replicate: int = 0,
    attention: bool = True,
) -> str:
    tags = {
        "mlflow.parentRunId": parent_id,
        "sweep_id": sweep_id,
        "variant": variant,
        "fold": str(fold),
        "role": "train",
    }
    if spec.replicates > 1:
        tags["replicate"] = str(replicate)
    run = client.create_run(exp_id, tags=tags, run_name=f"{variant}-f{fold}")
    rid = run.info.run_id
    params = {
        "data.window": spec.window,
        "data.window_stride": spec.stride,
        "data.horizons": str(spec.horizons),
        "data.n_folds": 3,
        "data.fold": fold,
        "model.mamba.chunk": 16,
        "data.embargo": "None",
        "seed": run_seed(spec.seed, fold, replicate),
        **spec.extra_params,
        "trainer.epochs": spec.epochs,
        "model.attention_pool": variant,
        "git_sha": "0123abc",
        "data_hash": "feedbeef",
    }
    params.update(spec.param_override.get((variant, fold), {}))
    aucs = {}
    for j, h in enumerate(spec.horizons):
        m = pred["mask"][:, j]
        aucs[h] = auc(pred["probs"][m, j], pred["labels"][m, j]) + auc_shift
    if spec.nan_metric is not None and spec.nan_metric[:2] == (variant, fold):
        aucs[spec.nan_metric[2]] = float("nan")
    now = int(time.time() * 1000)
    metrics = []
    for epoch in range(spec.epochs):
        late = spec.epochs - 1 - epoch  # earlier epochs a little worse
        metrics += [Metric(f"val_auc_h{h}", a - 0.01 * late, now, epoch) for h, a in aucs.items()]
        metrics += [
            Metric("val_auc_mean", float(np.mean(list(aucs.values()))) - 0.01 * late, now, epoch),
            Metric("train_loss", 0.69 - 0.01 * epoch, now, epoch),
            Metric("val_loss", 0.69 - 0.005 * epoch, now, epoch),
            Metric(
                "samples_per_s",
                spec.samples_per_s[min(list(spec.arms()).index(variant), 1)] * (1 + 0.01 * epoch),
                now,
                epoch,
            ),
        ]
        metrics += [Metric(k, float(v), now, epoch) for k, v in spec.diagnostics.get(variant, {}).items()]
    client.log_batch(
        rid,
        metrics=metrics,
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag("mlflow.runName", f"{variant}-f{fold}")],
    )
    if spec.no_predictions != (variant, fold):
        d = tmp / rid / "predictions"
        d.mkdir(parents=True)
        np.savez(d / "val_final.npz", **pred)
        client.log_artifact(rid, str(d / "val_final.npz"), artifact_path="predictions")
    if not attention:
        if finish:
            client.set_terminated(rid, "FINISHED")
        return rid
    names = [f"h{h}" for h in spec.horizons] if variant == "per_horizon" else ["shared"]
    edges = np.array([0, 1, 2, 4, 8, 16, spec.window], dtype=np.int64)
    mass = np.random.default_rng(fold).dirichlet(np.ones(6), size=len(names)).astype(np.float32)
    d = tmp / rid / "diagnostics"
    d.mkdir(parents=True)
    np.savez(d / "attention_by_lag.npz", lag_edges=edges, mass=mass, query_names=np.asarray(names))
    client.log_artifact(rid, str(d / "attention_by_lag.npz"), artifact_path="diagnostics")
    if finish:
        client.set_terminated(rid, "FINISHED")
    return rid
