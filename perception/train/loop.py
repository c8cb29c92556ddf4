"""`train(cfg) -> metrics`: one run of the A/B (a variant on a fold), resumable and tracked.

Order of an epoch's end, chosen so that a kill at any point loses nothing: metrics go to the run's
ledger, then the checkpoint is written, then the ledger is sent to MLflow, on a thread beside the
training (a slow or restarting server delays the record, not the next epoch; the run's end waits for
it). A resumed run redoes at most the epoch it was killed in, with the same batches and RNG, so it ends
bit-identical."""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from perception.atomic import atomic_path, atomic_write_text
from perception.contract import ATTENTION, ATTENTION_PLOT, PREDICTIONS, SAMPLES_PER_S, val_auc
from perception.errors import ConfigError
from perception.gitinfo import git_sha
from perception.locks import run_lock
from perception.paths import DONE_FILE, new_sweep_id, perception_home, tracking_uri
from perception.run_id import RunId
from perception.tracking import RunLedger, ensure_parent_run, store_identity
from perception.train.config import Config, apply_arm
from perception.train.diagnostics import GradNorms, query_drift, query_names, save_attention_by_lag
from perception.train.epoch import train_epoch
from perception.train.evaluate import Evaluation, evaluate
from perception.train.params import flatten_config
from perception.train.precision import configure as configure_precision
from perception.train.progress import progress
from perception.train.run_record import RunRecord, sigterm_deferred, write_config
from perception.train.runlog import LOG_FILE, RunLog
from perception.train.schedule import warmup_cosine
from perception.train.state import Position, load_state, save_checkpoint
from perception.train.validate import check_config, check_resume, resolve_device

if TYPE_CHECKING:
    from perception.model import PerceptionModel


@dataclass
class RunPlace:
    run: RunId
    home: Path
    dir: Path  # run.directory(home), resolved once


def place_of(cfg: Config) -> RunPlace:
    """The run's identity and directory; applies the arm's model fields and the run's own seed (`RunId.seed`)."""
    home = perception_home()
    sweep_id = cfg.sweep_id or new_sweep_id()
    arm = apply_arm(cfg)
    fold, replicate = int(cfg.data.fold), int(cfg.replicate)
    if replicate < 0:
        raise ConfigError(f"replicate={replicate}: expected 0 or a positive replicate number")
    run = RunId(sweep_id, arm, fold, replicate)
    cfg.seed = run.seed(int(cfg.seed))
    return RunPlace(run, home, run.directory(home))


def train(cfg: Config, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Runs (or resumes, or recognises as finished) one training run; returns its final metrics.
    However it ends, its MLflow run says so: FINISHED, FAILED (it raised) or KILLED (KeyboardInterrupt,
    which perception-train also raises on SIGTERM), with its train.log and config uploaded."""
    place = place_of(cfg)
    check_config(cfg)  # a refused start leaves no run directory
    with run_lock(place.dir, place.run.sweep_id):  # a second trainer of this run exits here, having touched nothing
        return _train_locked(cfg, overrides, place)


def _train_locked(cfg: Config, overrides: Sequence[str], place: RunPlace) -> dict[str, Any]:
    resume_from = check_resume(cfg, place.dir)  # its checkpoint suits this config, before any work
    done = place.dir / DONE_FILE
    if done.exists():
        ledger = RunLedger(place.dir, tracking_uri(cfg.tracking.uri, place.home), cfg.tracking.experiment)
        pending = len(ledger.unsent())
        if pending:  # finished during an outage: send what was kept
            ok = ledger.flush(force=True)
            print(
                f"[perception] sent {pending - len(ledger.unsent())} of {pending} pending tracking operations"
                + ("" if ok else f"; still unreachable: {ledger.failures()[-1]}")
            )
        print(f"[perception] {place.dir.name} of sweep {place.run.sweep_id} already finished; nothing to do")
        return json.loads(done.read_text())["metrics"]
    write_config(place.dir, cfg, overrides)
    record = RunRecord(
        RunLedger(place.dir, tracking_uri(cfg.tracking.uri, place.home), cfg.tracking.experiment),
        bool(cfg.tracking.system_metrics),
        settles_parent=not cfg.tracking.parent_run_id,
    )
    with RunLog(place.dir / LOG_FILE) as log:
        try:
            return _train(cfg, place, resume_from, record)
        except BaseException as exc:
            with sigterm_deferred():  # a SIGTERM now must not cut the recording of this end short
                log.exception(exc)
                record.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
            raise


def _train(cfg: Config, place: RunPlace, resume_from: Optional[Path], record: RunRecord) -> dict[str, Any]:
    from perception.data import Normalizer, WindowLoader, load_dataset, median_dt, prefetched, purged_split
    from perception.model import PerceptionModel, masked_bce
    from perception.model.checkpoint import load_model, load_trunk, save_model

    device = resolve_device(cfg.trainer.device)
    _set_determinism(cfg, device)

    # ---- data ------------------------------------------------------------------------------
    ds = load_dataset(cfg.data, place.home, progress=cfg.trainer.progress)
    split = purged_split(ds, cfg.data)
    window, horizons = int(cfg.data.window), list(ds.horizons)
    norm = Normalizer.fit(ds, split.train_ends, window)
    order_seed = int(cfg.seed) * 1009 + place.run.fold  # batch order: seed and fold only, same for both arms
    pin = device.type == "cuda"  # page-locked batches: the copy to the GPU overlaps the step before

    def loader(ends: np.ndarray, batch_size: int, shuffle: bool) -> WindowLoader:
        """Windows ending at `ends`, z-scored with the training fold's statistics, in the run's batch order."""
        return WindowLoader(
            ds, ends, window, batch_size, normalizer=norm, shuffle=shuffle, seed=order_seed, pin_memory=pin
        )

    train_loader = loader(split.train_ends, cfg.trainer.batch_size, shuffle=True)
    val_loader = loader(split.val_ends, cfg.trainer.eval_batch_size, shuffle=False)
    steps_per_epoch = len(train_loader)
    if cfg.trainer.max_train_batches:
        steps_per_epoch = min(steps_per_epoch, int(cfg.trainer.max_train_batches))

    # ---- model and optimisation --------------------------------------------------------------
    model = PerceptionModel(cfg.model, n_features=ds.features.shape[1], horizons=horizons, seed=int(cfg.seed))
    model.set_dt_scale(float(median_dt(ds, split.train_ends, window)))
    query_init = model.pool.query.detach().clone()  # the seeded start, for query_drift (resumed runs too)
    if cfg.trainer.init_from and resume_from is None:
        loaded = load_trunk(cfg.trainer.init_from, model)
        print(f"[perception] warm start: {len(loaded)} trunk tensors from {cfg.trainer.init_from}")
    model.to(device)
    optimizer = torch.optim.AdamW(
        _param_groups(model, cfg.trainer.lr * cfg.trainer.query_lr_scale, cfg.trainer.lr),
        lr=cfg.trainer.lr,
        weight_decay=cfg.trainer.weight_decay,
    )
    total_steps = steps_per_epoch * int(cfg.trainer.epochs)
    scheduler = warmup_cosine(optimizer, total_steps, cfg.trainer.warmup_frac)
    weights = None
    if cfg.trainer.horizon_weights:
        weights = torch.tensor(list(cfg.trainer.horizon_weights), dtype=torch.float32, device=device)

    def loss_fn(logits, y, mask):
        return masked_bce(logits, y, mask, weights)

    position = Position(epoch=0)
    if resume_from is not None:
        load_model(resume_from / "model.safetensors", model)
        state = load_state(resume_from)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng_cpu"])
        if device.type == "cuda" and "rng_cuda" in state:
            torch.cuda.set_rng_state(state["rng_cuda"])
        position = Position(**state["position"])
        print(f"[perception] resuming {place.dir.name} at epoch {position.epoch + 1} from {resume_from}")

    # ---- tracking ----------------------------------------------------------------------------
    uri, ledger = record.ledger.tracking_uri, record.ledger
    if not ledger.entries():
        parent = cfg.tracking.parent_run_id or _parent_or_none(place.run.sweep_id, uri, cfg.tracking.experiment)
        tags = place.run.tags()
        if parent:
            tags["mlflow.parentRunId"] = parent
        params = flatten_config(cfg)
        params.update(
            {
                "git_sha": git_sha(),
                "data_hash": ds.data_hash,
                "sweep_id": place.run.sweep_id,
                "experiment": str(cfg.experiment_name),
            }
        )
        ledger.record(
            "start",
            tags=tags,
            params=params,
            run_name=place.run.name,
            experiment=cfg.tracking.experiment,
            store=store_identity(uri),
        )
    else:
        ledger.record("tags", tags={"resumed_at_epoch": str(position.epoch)})
        ledger.record("status", status="RUNNING")  # the attempt before may have ended KILLED
    record.status_changed()
    ledger.flush(force=True)
    record.monitoring()
    record.send_in_background()

    # ---- epochs ------------------------------------------------------------------------------
    last_eval: Evaluation | None = None
    metrics: dict[str, float] = {}
    for epoch in range(position.epoch, int(cfg.trainer.epochs)):
        model.train()
        grad_norms = GradNorms(model)
        bar = progress(
            steps_per_epoch, f"{place.run.name} epoch {epoch + 1}/{cfg.trainer.epochs}", cfg.trainer.progress
        )
        with prefetched(islice(train_loader.batches(epoch), steps_per_epoch), device) as batches:
            totals = train_epoch(
                model,
                batches,
                optimizer,
                scheduler,
                loss_fn,
                precision=cfg.trainer.precision,
                device=device,
                grad_clip=cfg.trainer.grad_clip,
                epoch=epoch,
                grad_norms=grad_norms,
                bar=bar,
                after_step=record.send_soon,
            )  # sends what an outage kept, as the backoff allows
        bar.close()
        last_eval = evaluate(model, val_loader, loss_fn, horizons, window, device, cfg.trainer.precision)
        metrics = {val_auc(h): v for h, v in last_eval.auc.items()}
        metrics.update(val_auc_mean=last_eval.auc_mean, train_loss=totals.mean_loss, val_loss=last_eval.loss)
        metrics[SAMPLES_PER_S] = totals.samples_per_s
        metrics.update(
            grad_norms.means(),
            **last_eval.attention_stats.metrics(),
            query_drift=query_drift(model.pool.query, query_init),
        )
        if not ledger.has_metrics_for(epoch):
            ledger.record("metrics", step=epoch, values=metrics)
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "position": {"epoch": epoch + 1, "batch": 0},
        }
        if device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state()
        save_checkpoint(
            place.dir,
            f"epoch-{epoch + 1:04d}",
            lambda p: save_model(p, model, {"sweep_id": place.run.sweep_id, "epoch": str(epoch + 1)}),
            state,
        )
        record.send_soon(force=True)
        record.monitoring()  # started late after an outage, or restarted after a failed request
        print(
            f"[perception] {place.run.name} epoch {epoch + 1}/{cfg.trainer.epochs}: "
            + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
            flush=True,
        )

    # ---- final artifacts ---------------------------------------------------------------------
    if last_eval is None:  # resumed after the last epoch's checkpoint: recompute, deterministically
        last_eval = evaluate(model, val_loader, loss_fn, horizons, window, device, cfg.trainer.precision)
        metrics = _last_metrics(ledger)
    artifacts = _write_artifacts(place, last_eval, horizons)
    for rel, artifact_path in artifacts:
        ledger.record("artifact", path=rel, artifact_path=artifact_path)
    sent = record.end("FINISHED")
    unsent = ledger.unsent()
    atomic_write_text(
        place.dir / DONE_FILE,
        json.dumps({"run_id": ledger.run_id(), "metrics": metrics, "unsent": len(unsent)}, indent=2, sort_keys=True),
    )
    if not sent:
        print(
            f"[perception] WARNING: the tracking server ({uri}) was unreachable; {len(unsent)} operations "
            f"are kept in {place.dir / 'tracking.jsonl'} and will be sent by "
            f"`perception-sweep sync --sweep-id {place.run.sweep_id}` or a resumed run. Last error: "
            f"{(ledger.failures() or ['none'])[-1]}",
            flush=True,
        )
    print(
        f"[perception] finished {place.run.name} (sweep {place.run.sweep_id}, "
        f"run {ledger.run_id()}): val_auc_mean={metrics.get('val_auc_mean', float('nan')):.4f}",
        flush=True,
    )
    return metrics


def _write_artifacts(place: RunPlace, ev: Evaluation, horizons: list[int]) -> list[tuple[str, str]]:
    """The contract's artifacts, each as (its path in the run directory, its folder in the MLflow run)."""
    written = (PREDICTIONS, ATTENTION, ATTENTION_PLOT)
    for rel in written:
        (place.dir / rel).parent.mkdir(exist_ok=True)
    with atomic_path(place.dir / PREDICTIONS) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, probs=ev.probs, labels=ev.labels, mask=ev.mask, index=ev.index)
    names = query_names(ev.attention.sums.shape[0], horizons)
    save_attention_by_lag(
        place.dir / ATTENTION,
        place.dir / ATTENTION_PLOT,
        ev.attention,
        names,
        title=f"attention by lag: {place.run.name}",
    )
    return [(rel, Path(rel).parent.as_posix()) for rel in written]


def _param_groups(model: PerceptionModel, query_lr: float, base_lr: float) -> list[dict]:
    """The pool query in a group of its own when its rate differs (trainer.query_lr_scale); one group
    otherwise, the layout of checkpoints written before the option, so they still resume."""
    if query_lr == base_lr:
        return [{"params": list(model.parameters())}]
    query = model.pool.query
    return [{"params": [p for p in model.parameters() if p is not query]}, {"params": [query], "lr": query_lr}]


def _last_metrics(ledger: RunLedger) -> dict[str, float]:
    recorded = [e for e in ledger.entries() if e["op"] == "metrics"]
    return recorded[-1]["values"] if recorded else {}


def _parent_or_none(sweep_id: str, uri: str, experiment: str) -> str | None:
    try:
        return ensure_parent_run(sweep_id, uri, experiment)
    except Exception as exc:  # server down: the run is still tagged with sweep_id and trains on
        print(f"[perception] WARNING: could not find or create the parent run of {sweep_id}: {exc}")
        return None


def _set_determinism(cfg: Config, device: torch.device) -> None:
    torch.manual_seed(int(cfg.seed))
    np.random.seed(int(cfg.seed) % 2**32)
    if cfg.trainer.num_threads:
        torch.set_num_threads(int(cfg.trainer.num_threads))
    configure_precision(cfg.trainer.precision, device)


def finished(run_dir: Path) -> bool:
    return (run_dir / DONE_FILE).exists()
