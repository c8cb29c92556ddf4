"""The A/B on one machine (DESIGN §7): feature cache and parent run, the trainings, then the gate.

Every step is the installed command a pod would run, so a local sweep exercises exactly what the
Argo workflow does; re-running with the same sweep_id skips finished runs (done.json) and lets
`perception-train` resume unfinished ones from their run directories. One process at a time works on
a sweep: both `local` and `prepare` hold its lock (perception.locks) for their lifetime."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from perception.errors import ConfigError, PerceptionError
from perception.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from perception.locks import RUN_LOCK, read_holder, sweep_lock
from perception.mlflow_logs import mlflow_info_into
from perception.paths import DONE_FILE, check_sweep_id, new_sweep_id, perception_home, sweep_dir, tracking_uri
from perception.run_id import RunId
from perception.gate.sequential import CONTINUE
from perception.sweep.design import Design, plan_tags, study_runs
from perception.rounds import idle_lanes
from perception.sweep.devices import CPU_LANE, child_env, detect_gpus, plan_waves
from perception.sweep.overrides import check_overrides, experiment_gate_config
from perception.sweep.pins import composed_values, pin, started_values
from perception.sweep.prepare import build_features, command
from perception.sweep.trainers import Trainers
from perception.tracking import parent_run_tags


SWEEP_LOG = "sweep.log"  # in the sweep's directory: MLflow's INFO lines of the sweep and its gate


@dataclass
class RunOutcome:
    spec: RunId
    status: str  # "skipped" (finished earlier) | "finished" | "failed"
    seconds: float = 0.0
    run_id: Optional[str] = None
    returncode: Optional[int] = None
    log: Optional[Path] = None
    note: Optional[str] = None  # why it failed, when the exit code does not say (another trainer has it)


@dataclass
class SweepResult:
    sweep_id: str
    parent_run_id: str
    runs: list[RunOutcome] = field(default_factory=list)
    gate: Any = None  # GateOutcome
    wall_s: float = 0.0

    @property
    def exit_code(self) -> int:
        failed = any(r.status == "failed" for r in self.runs)
        refused = self.gate is None or getattr(self.gate, "refused", True)
        return EXIT_FAILED if failed or refused else EXIT_OK


# ---- steps -----------------------------------------------------------------------------------
def _train_one(
    spec: RunId,
    args: list[str],
    env: dict[str, str],
    log: Optional[Path],
    home: Path,
    trainers: Trainers,
) -> RunOutcome:
    t0 = time.perf_counter()
    directory = spec.directory(home)
    if log is None:  # sequential: the trainer's own progress bar goes to the terminal
        rc, pid = trainers.run(args, env)
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            rc, pid = trainers.run(args, env, f)
    seconds = time.perf_counter() - t0
    done = _read_done(directory)
    ok = rc == 0 and done is not None
    holder = read_holder(directory / RUN_LOCK) if rc == EXIT_USAGE else None
    note = f"trained by another process, {holder.describe()}" if holder and holder.pid != pid else None
    return RunOutcome(
        spec, "finished" if ok else "failed", seconds, done.get("run_id") if done else None, rc, log, note
    )


def _read_done(directory: Path) -> Optional[dict]:
    path = directory / DONE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PerceptionError(f"{path}: unreadable ({exc}); delete it to train that run again") from exc


# ---- the sweep -------------------------------------------------------------------------------
def run_local_sweep(
    sweep_id: Optional[str] = None,
    overrides: Sequence[str] = (),
    *,
    gpus: Optional[list[str]] = None,
    train_command: Optional[list[str]] = None,
    data_command: Optional[list[str]] = None,
    gate: Optional[Callable[..., Any]] = None,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    design: Optional[Design] = None,
    cpu_workers: int = 1,
) -> SweepResult:
    """Runs (or completes) the whole study; returns every run's outcome and the gate's."""
    from perception.train.compose import composed

    t_start = time.perf_counter()
    design = design or Design()
    check_overrides(overrides)
    cfg = composed(overrides, checked=True)
    sweep_id = check_sweep_id(sweep_id or new_sweep_id())
    home = perception_home()
    uri = tracking_uri(cfg.tracking.uri, home)
    env = {**os.environ, "PERCEPTION_HOME": str(home)}
    gpus = detect_gpus(os.environ) if gpus is None else gpus
    runs = study_runs(sweep_id, int(cfg.data.n_folds), design.arms, design.replicates)
    gate_config = experiment_gate_config(cfg)  # before any work: an experiment without one is refused
    lanes = gpus or ([CPU_LANE] * cpu_workers if cpu_workers > 1 else [])  # no lanes: one run at a time

    trainers = Trainers()
    early = io.StringIO()  # MLflow's lines before the sweep's directory may be made: kept for its log
    with mlflow_info_into(early):
        started = started_values(parent_run_tags(sweep_id, uri, cfg.tracking.experiment))
    overrides, notes, pinned = pin(sweep_id, started, composed_values(cfg), overrides)  # refused before any work
    for note in notes:
        say(note)
    first_tags = {**plan_tags(design, gate_config), **pinned}
    log = sweep_dir(sweep_id, home) / SWEEP_LOG
    with _sweep_lock_and_parent(
        sweep_id, home, uri, cfg.tracking.experiment, first_tags, say, log, early.getvalue()
    ) as parent:
        where = (
            f"{len(gpus)} GPU(s) in parallel"
            if gpus
            else f"{cpu_workers} at a time on CPU"
            if lanes
            else "sequentially on CPU"
        )
        waves = (
            f" in waves of {len(runs) // design.replicates}, the gate after each (sequential design)"
            if design.sequential
            else ""
        )
        say(
            f"sweep {sweep_id}: {'up to ' if design.sequential else ''}{len(runs)} runs {where}{waves}; "
            f"parent run {parent}; tracking {uri}; MLflow's messages in {log}"
        )
        result = SweepResult(sweep_id, parent)

        _send_kept_operations(sweep_id, home, uri, say)  # a finished run is complete in MLflow before it is skipped
        trainer = train_command or command("perception-train")
        built: list[bool] = []  # the feature cache built (once, before the first training)

        def train(specs: list[RunId], ahead: Sequence[RunId] = ()) -> None:
            """Trains those of `specs` not finished earlier (the feature cache built first, once); the
            last round's idle lanes take the first unfinished trainings of `ahead` (the next wave)."""
            pending = []
            for spec in specs:
                if any(r.spec == spec for r in result.runs):
                    continue  # trained ahead on an idle lane; one that failed is retried by a re-run, as in its wave
                done = _read_done(spec.directory(home))
                if done is not None:
                    run_id = _mlflow_run_id(spec.directory(home), uri) or done.get("run_id")
                    result.runs.append(RunOutcome(spec, "skipped", run_id=run_id))
                    say(f"[{len(result.runs)}/{len(runs)}] {spec.label}: finished earlier (run {run_id}), skipped")
                else:
                    pending.append(spec)
            unfinished = [s for s in ahead if _read_done(s.directory(home)) is None]
            fill = unfinished[: idle_lanes(len(pending), len(lanes))]
            if fill:
                say(
                    f"{len(fill)} training(s) of replicate {fill[0].replicate} start on the last round's idle "
                    f"lane(s); the look before them does not read them"
                )
            pending += fill
            if pending and not built:
                say("building the feature cache (perception-data build)")
                build_features(overrides, env, data_command)
                built.append(True)
            for wave in plan_waves(pending, lanes):
                _train_wave(
                    wave,
                    result,
                    len(runs),
                    t_start,
                    lanes,
                    trainer,
                    overrides,
                    parent,
                    home,
                    env,
                    trainers,
                    say,
                )

        run_gate: Callable[..., Any]  # the gate given, else perception-gate's
        if gate is None:
            from perception.gate.run import run_gate
        else:
            run_gate = gate

        def decide(**look: int) -> Any:
            say(f"gate: sweep {sweep_id}, config {gate_config}, {design.control} -> {design.treatment}")
            return run_gate(
                sweep_id,
                tracking_uri=uri,
                experiment=cfg.tracking.experiment,
                config_name=gate_config,
                control=design.control,
                treatment=design.treatment,
                **look,
            )

        if not design.sequential:
            train(runs)
            result.gate = decide()
        else:
            for wave in range(design.replicates):
                specs = [s for s in runs if s.replicate == wave]
                later = [s for s in runs if s.replicate == wave + 1]
                train(specs, ahead=later)
                ahead = [r for r in result.runs if r.spec.replicate > wave]  # trained on idle lanes just now
                if later and all(_read_done(s.directory(home)) for s in later) and not ahead:
                    continue  # resumed past this look: the gate decides every look up to the last wave anyway
                # this look's waves only: a later one half-trained before an interruption is not read
                result.gate = decide(look=wave + 1)
                say(look_line(result.gate))
                if result.gate.refused or result.gate.decision != CONTINUE:
                    kept = sum(r.status == "finished" for r in ahead)
                    if kept:
                        say(
                            f"{kept} training(s) of replicate {wave + 1} ran on idle lanes before the study "
                            f"stopped at look {wave + 1}: kept as finished runs, not read by its decision"
                        )
                    break
        result.wall_s = time.perf_counter() - t_start
        return result


def _train_wave(
    wave: list[tuple[RunId, Optional[str]]],
    result: SweepResult,
    total: int,
    t_start: float,
    lanes: list[str],
    trainer: list[str],
    overrides: Sequence[str],
    parent: str,
    home: Path,
    env: dict[str, str],
    trainers: Trainers,
    say: Callable[[str], None],
) -> None:
    """One round of trainings side by side (one per lane), each the installed perception-train."""
    for spec, device in wave:
        d = spec.directory(home)
        verb = "resuming" if d.is_dir() and any(d.iterdir()) else "training"
        say(
            f"[{len(result.runs) + 1 + wave.index((spec, device))}/{total}] {spec.label}: {verb}"
            + (
                f" on {'CPU' if device == CPU_LANE else f'GPU {device}'} (log {d / 'train.log'})"
                if device is not None
                else ""
            )
        )

    def one(item: tuple[RunId, Optional[str]]) -> RunOutcome:
        spec, device = item
        args = [
            *trainer,
            *overrides,
            f"sweep_id={spec.sweep_id}",
            *spec.overrides(),
            f"tracking.parent_run_id={parent}",
        ]
        log = spec.directory(home) / "train.log" if device is not None else None
        return _train_one(spec, args, child_env(env, device), log, home, trainers)

    with ThreadPoolExecutor(max_workers=len(wave)) as pool:
        try:
            outcomes = list(pool.map(one, wave))
        except BaseException:  # interrupted: end the trainings (KILLED) before the pool waits for them
            trainers.stop()
            raise
    for out in outcomes:
        result.runs.append(out)
        say(_progress_line(out, result, total, time.perf_counter() - t_start, max(1, len(lanes))))
    rejected = [o.spec.label for o in outcomes if o.returncode == EXIT_USAGE and o.note is None]
    if rejected:  # the same config fails every run
        raise ConfigError(f"perception-train rejected the configuration (exit 2) for {', '.join(rejected)}")


def look_line(gate: Any) -> str:
    """One line per look of a sequential study: what the gate saw and what happens next."""
    s = getattr(gate, "summary", {}) or {}
    if gate.refused:
        return "look: refused — " + "; ".join(gate.reasons)
    look: dict = next((r for r in s.get("looks", []) if r["look"] == s.get("look")), {})
    fmt = lambda x, f: "–" if x is None else format(x, f)  # noqa: E731
    head = (
        f"look {s.get('look')}/{s.get('max_looks')}: W {fmt(look.get('W'), '+.4f')}, G {fmt(look.get('G'), '+.4f')}, "
        f"p(W) {fmt(look.get('p_W'), '.3g')}, p(G) {fmt(look.get('p_G'), '.3g')}, "
        f"alpha_k {fmt(look.get('efficacy_alpha'), '.3g')} -> {gate.decision}"
    )
    return head + (f" ({s.get('why_stopped')})" if s.get("why_stopped") else "")


def _send_kept_operations(sweep_id: str, home: Path, uri: str, say: Callable[[str], None]) -> None:
    """What the runs kept through a tracking outage, sent now; finished runs missing or unfinished in
    MLflow completed from their ledgers (perception.tracking.recover_sweep). The gate does it again
    before deciding, for the runs trained meanwhile."""
    from perception.tracking import recover_sweep

    recovery = recover_sweep(sweep_id, home, uri)
    if recovery.sent:
        say(
            f"sent {recovery.sent} tracking operation(s) the sweep's runs kept while the tracking server was "
            "unreachable"
        )
    for line in recovery.completed:
        say(f"completed from its ledger: {line}")
    for line in recovery.stuck:
        say(f"still kept, not sent: {line}")


def _mlflow_run_id(directory: Path, uri: str) -> Optional[str]:
    from perception.tracking import RunLedger

    return RunLedger(directory, uri).run_id()


@contextmanager
def _sweep_lock_and_parent(
    sweep_id: str,
    home: Path,
    uri: str,
    experiment: str,
    plan: dict[str, str],
    say: Callable[[str], None],
    log: Path,
    logged_before: str = "",
) -> Iterator[str]:
    """Holds the sweep's lock (a second start on this id exits 2 here) and yields its parent run, which
    ends KILLED or FAILED should the sweep end by an exception: a re-run sets it RUNNING again. Meanwhile
    MLflow's INFO lines go to the sweep's `log` (after `logged_before`), not the terminal."""
    from perception.tracking import ensure_parent_run

    with (
        sweep_lock(sweep_dir(sweep_id, home), sweep_id),
        open(log, "a", encoding="utf-8") as log_file,
        mlflow_info_into(log_file),
    ):
        log_file.write(logged_before)
        parent = ensure_parent_run(sweep_id, uri, experiment, plan)
        try:
            yield parent
        except BaseException as exc:
            _end_parent(parent, uri, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED", say)
            raise


def _end_parent(parent: str, uri: str, status: str, say: Callable[[str], None]) -> None:
    from perception.tracking import client

    try:
        client(uri).set_terminated(parent, status)
    except Exception as exc:  # the tracking server is down: say so, keep the original error
        say(f"could not end the parent run {parent} as {status}: {type(exc).__name__}: {exc}")


def _progress_line(out: RunOutcome, result: SweepResult, total: int, elapsed: float, lanes: int) -> str:
    n = len(result.runs)
    trained = [r.seconds for r in result.runs if r.status != "skipped"]
    eta = (total - n) * sum(trained) / len(trained) / lanes if trained else 0.0
    head = f"[{n}/{total}] {out.spec.label}: "
    if out.status == "finished":
        body = f"finished in {out.seconds:.1f} s (run {out.run_id})"
    else:
        where = f"; log {out.log}" if out.log else ""
        body = f"FAILED (exit {out.returncode}) after {out.seconds:.1f} s{where}" + (
            f": {out.note}" if out.note else ""
        )
    return head + body + f" · elapsed {_clock(elapsed)}" + (f" · ETA {_clock(eta)}" if n < total else "")


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
