"""The A/B on one machine (DESIGN §7): feature cache and parent run, six trainings, then the gate.

Every step is the installed command a pod would run, so a local sweep exercises exactly what the
Argo workflow does; re-running with the same sweep_id skips finished runs (done.json) and lets
`perception-train` resume unfinished ones from their run directories. One process at a time works on
a sweep: both `local` and `prepare` hold its lock (perception.locks) for their lifetime."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from perception.arms import DEFAULT_ARMS, DEFAULT_CONTROL, DEFAULT_TREATMENT, TWIN_SUFFIX, get_arm, parse_arms
from perception.atomic import atomic_write_text
from perception.errors import ConfigError, PerceptionError
from perception.locks import RUN_LOCK, read_holder, sweep_lock
from perception.paths import new_sweep_id, perception_home, run_dir, sweep_dir, tracking_uri
from perception.sweep.devices import CPU_LANE, child_env, detect_gpus, plan_waves
from perception.sweep.trainers import Trainers

DEFAULT_SCALE = "local"  # conf/config.yaml's default `experiment`
AUTO_GATE_CONFIG = "auto"  # the gate config that belongs to the experiment (gate_config_for)
DONE_FILE = "done.json"
# Set per run by the sweep itself; a user override would silently break the study's design.
RESERVED_KEYS = ("sweep_id", "arm", "replicate", "model.attention_pool", "model.shared_context_to_heads",
                 "model.twin", "data.fold", "tracking.parent_run_id")
SWEEP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class RunSpec:
    arm: str
    fold: int
    replicate: int = 0

    @property
    def label(self) -> str:
        return f"{self.arm} fold {self.fold}" + (f" replicate {self.replicate}" if self.replicate else "")

    def directory(self, sweep_id: str, home: Path) -> Path:
        return run_dir(sweep_id, self.arm, self.fold, home, self.replicate)

    def overrides(self) -> list[str]:
        return [f"arm={self.arm}", f"data.fold={self.fold}", f"replicate={self.replicate}"]


@dataclass
class RunOutcome:
    spec: RunSpec
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
        return 1 if failed or refused else 0


# ---- configuration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """Which arms train, how many replicates, and which two the gate compares."""
    arms: tuple[str, ...] = DEFAULT_ARMS
    replicates: int = 1
    control: str = DEFAULT_CONTROL
    treatment: str = DEFAULT_TREATMENT

    @classmethod
    def of(cls, arms: Optional[str] = None, replicates: int = 1, aa: bool = False,
           control: Optional[str] = None, treatment: Optional[str] = None) -> "Design":
        """From the command line: `--aa` trains the control against its twin (the A/A test)."""
        if replicates < 1:
            raise ConfigError(f"--replicates {replicates}: expected 1 or more")
        if aa:
            # the workflow always passes its `arms` parameter: the default list means "not chosen"
            if (arms and parse_arms(arms) != DEFAULT_ARMS) or treatment:
                raise ConfigError("--aa trains the control against its twin: drop --arms and --treatment")
            control = control or DEFAULT_CONTROL
            get_arm(control)
            return cls((control, control + TWIN_SUFFIX), replicates, control, control + TWIN_SUFFIX)
        names = parse_arms(arms) if arms else DEFAULT_ARMS
        control, treatment = control or DEFAULT_CONTROL, treatment or DEFAULT_TREATMENT
        for flag, name in (("--control", control), ("--treatment", treatment)):
            if name not in names:
                raise ConfigError(f"{flag} {name!r} is not among the sweep's arms {list(names)}")
        if control == treatment:
            raise ConfigError(f"--control and --treatment are both {control!r}: expected two different arms")
        return cls(tuple(names), replicates, control, treatment)


def plan_tags(design: Design, gate_config: str, overrides: Sequence[str] = ()) -> dict[str, str]:
    """The gate plan the parent run records before any training (pre-registration)."""
    from perception.gate.config import load_gate_config
    from perception.gate.study import PLAN_TAG, gate_plan

    plan = gate_plan(load_gate_config(gate_config, overrides), design.control, design.treatment,
                     list(design.arms), design.replicates)
    return {PLAN_TAG: json.dumps({**plan, "config": gate_config}, sort_keys=True)}



def check_overrides(overrides: Sequence[str]) -> None:
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"{o!r}: the sweep takes Hydra overrides only (key=value), not flags")
        key = o.lstrip("+~").split("=", 1)[0]
        if key in RESERVED_KEYS:
            raise ConfigError(f"override {o!r}: {key} is set by the sweep for each run; remove it "
                              f"(use --sweep-id to name the sweep)")


def check_sweep_id(sweep_id: str) -> str:
    """A directory name and an MLflow tag value that needs no quoting (Argo's workflow names fit)."""
    if not SWEEP_ID_RE.match(sweep_id):
        raise ConfigError(f"sweep_id {sweep_id!r}: expected letters, digits, '.', '_' or '-', "
                          f"at most 63 characters, starting with a letter or digit")
    return sweep_id


def compose(overrides: Sequence[str]):
    """The training config these overrides give, composed up front so a typo fails before any work."""
    from perception.train.compose import composed

    try:
        return composed(overrides)
    except ConfigError as exc:
        raise ConfigError(f"overrides {list(overrides)}: {exc}") from None


def experiment_of(overrides: Sequence[str]) -> str:
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")]
    return chosen[-1] if chosen else DEFAULT_SCALE


def gate_config_for(experiment: str) -> str:
    """conf/gate/<experiment>.yaml when it exists (its horizons match the experiment's), else default."""
    from perception.gate.config import config_exists

    return experiment if config_exists(experiment) else "default"


def resolve_gate_config(name: str, overrides: Sequence[str]) -> str:
    """The workflow's `gate-config` parameter: `auto` is the experiment's own, anything else as given."""
    return gate_config_for(experiment_of(overrides)) if name == AUTO_GATE_CONFIG else name


def study_runs(n_folds: int, arms: Sequence[str] = DEFAULT_ARMS, replicates: int = 1) -> list[RunSpec]:
    """Replicate- then fold-major, so with several GPUs the arms of a fold train side by side."""
    return [RunSpec(a, f, r) for r in range(replicates) for f in range(n_folds) for a in arms]


def command(name: str) -> list[str]:
    found = shutil.which(name)
    if not found:
        raise PerceptionError(f"{name} is not on PATH; install the package (pip install -e .)")
    return [found]


# ---- steps -----------------------------------------------------------------------------------
def build_features(overrides: Sequence[str], env: dict[str, str], data_command: Optional[list[str]] = None) -> None:
    """`perception-data build`: fills the feature cache once, before trainings run side by side."""
    rc = subprocess.run([*(data_command or command("perception-data")), "build", *overrides], env=env).returncode
    if rc == 2:
        raise ConfigError(f"perception-data build {' '.join(overrides)} rejected the configuration (exit 2)")
    if rc != 0:
        raise PerceptionError(f"perception-data build failed (exit {rc})")


def prepare(sweep_id: str, overrides: Sequence[str], parent_run_id_file: Optional[Path] = None,
            data_command: Optional[list[str]] = None, design: Optional[Design] = None,
            outputs: Optional[Path] = None, gate_config: str = AUTO_GATE_CONFIG) -> str:
    """The workflow's first step: feature cache plus the sweep's parent run (with its gate plan);
    returns its id. `outputs` receives the step's output parameters as files: parent-run-id, runs
    (the trainings to fan out, JSON), control, treatment and gate-config (`auto` resolved)."""
    from perception.tracking import ensure_parent_run

    design = design or Design()
    check_sweep_id(sweep_id)
    check_overrides(overrides)
    cfg = compose(overrides)
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home())}
    with sweep_lock(sweep_dir(sweep_id), sweep_id):
        build_features(overrides, env, data_command)
        gate_config = resolve_gate_config(gate_config, overrides)
        plan = plan_tags(design, gate_config)
        parent = ensure_parent_run(sweep_id, tracking_uri(cfg.tracking.uri), cfg.tracking.experiment, plan)
    if parent_run_id_file is not None:
        atomic_write_text(parent_run_id_file, parent)
    if outputs is not None:
        outputs.mkdir(parents=True, exist_ok=True)
        atomic_write_text(outputs / "parent-run-id", parent)
        atomic_write_text(outputs / "runs", json.dumps(fan_out(int(cfg.data.n_folds), design)))
        atomic_write_text(outputs / "control", design.control)
        atomic_write_text(outputs / "treatment", design.treatment)
        atomic_write_text(outputs / "gate-config", gate_config)
    return parent


def fan_out(n_folds: int, design: Design) -> list[dict[str, str]]:
    """The workflow's training items (withParam): one per arm, fold and replicate."""
    return [{"arm": s.arm, "fold": str(s.fold), "replicate": str(s.replicate)}
            for s in study_runs(n_folds, design.arms, design.replicates)]


def _train_one(spec: RunSpec, args: list[str], env: dict[str, str], log: Optional[Path], home: Path,
               sweep_id: str, trainers: Trainers) -> RunOutcome:
    t0 = time.perf_counter()
    directory = spec.directory(sweep_id, home)
    if log is None:  # sequential: the trainer's own progress bar goes to the terminal
        rc, pid = trainers.run(args, env)
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            rc, pid = trainers.run(args, env, f)
    seconds = time.perf_counter() - t0
    done = _read_done(directory)
    ok = rc == 0 and done is not None
    holder = read_holder(directory / RUN_LOCK) if rc == 2 else None
    note = f"trained by another process, {holder.describe()}" if holder and holder.pid != pid else None
    return RunOutcome(spec, "finished" if ok else "failed", seconds,
                      done.get("run_id") if done else None, rc, log, note)


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
    design: Optional["Design"] = None,
    cpu_workers: int = 1,
) -> SweepResult:
    """Runs (or completes) the whole study; returns every run's outcome and the gate's."""
    t_start = time.perf_counter()
    design = design or Design()
    check_overrides(overrides)
    cfg = compose(overrides)
    sweep_id = check_sweep_id(sweep_id or new_sweep_id())
    home = perception_home()
    uri = tracking_uri(cfg.tracking.uri, home)
    env = {**os.environ, "PERCEPTION_HOME": str(home)}
    gpus = detect_gpus(os.environ) if gpus is None else gpus
    runs = study_runs(int(cfg.data.n_folds), design.arms, design.replicates)
    gate_config = gate_config_for(experiment_of(overrides))
    lanes = gpus or ([CPU_LANE] * cpu_workers if cpu_workers > 1 else [])  # no lanes: one run at a time

    trainers = Trainers()
    with _sweep_lock_and_parent(sweep_id, home, uri, cfg.tracking.experiment, plan_tags(design, gate_config),
                                say) as parent:
        where = (f"{len(gpus)} GPU(s) in parallel" if gpus else
                 f"{cpu_workers} at a time on CPU" if lanes else "sequentially on CPU")
        say(f"sweep {sweep_id}: {len(runs)} runs {where}; parent run {parent}; tracking {uri}")
        result = SweepResult(sweep_id, parent)

        pending = []
        for spec in runs:
            done = _read_done(spec.directory(sweep_id, home))
            if done is not None:
                result.runs.append(RunOutcome(spec, "skipped", run_id=done.get("run_id")))
                say(f"[{len(result.runs)}/{len(runs)}] {spec.label}: finished earlier (run {done.get('run_id')}), skipped")
            else:
                pending.append(spec)

        if pending:
            say("building the feature cache (perception-data build)")
            build_features(overrides, env, data_command)
        trainer = train_command or command("perception-train")
        for wave in plan_waves(pending, lanes):
            for spec, device in wave:
                d = spec.directory(sweep_id, home)
                verb = "resuming" if d.is_dir() and any(d.iterdir()) else "training"
                say(f"[{len(result.runs) + 1 + wave.index((spec, device))}/{len(runs)}] {spec.label}: {verb}"
                    + (f" on {'CPU' if device == CPU_LANE else f'GPU {device}'} (log {d / 'train.log'})"
                       if device is not None else ""))

            def one(item: tuple[RunSpec, Optional[str]]) -> RunOutcome:
                spec, device = item
                args = [*trainer, *overrides, f"sweep_id={sweep_id}", *spec.overrides(), f"tracking.parent_run_id={parent}"]
                log = spec.directory(sweep_id, home) / "train.log" if device is not None else None
                return _train_one(spec, args, child_env(env, device), log, home, sweep_id, trainers)

            with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                try:
                    outcomes = list(pool.map(one, wave))
                except BaseException:  # interrupted: end the trainings (KILLED) before the pool waits for them
                    trainers.stop()
                    raise
            for out in outcomes:
                result.runs.append(out)
                say(_progress_line(out, result, len(runs), time.perf_counter() - t_start, max(1, len(lanes))))
            if any(o.returncode == 2 and o.note is None for o in outcomes):  # the same config fails every run
                raise ConfigError(f"perception-train rejected the configuration (exit 2) for "
                                  f"{', '.join(o.spec.label for o in outcomes if o.returncode == 2 and o.note is None)}")

        if gate is None:
            from perception.gate.run import run_gate as gate
        say(f"gate: sweep {sweep_id}, config {gate_config}, {design.control} -> {design.treatment}")
        result.gate = gate(sweep_id, tracking_uri=uri, experiment=cfg.tracking.experiment, config_name=gate_config,
                           control=design.control, treatment=design.treatment)
        result.wall_s = time.perf_counter() - t_start
        return result


@contextmanager
def _sweep_lock_and_parent(sweep_id: str, home: Path, uri: str, experiment: str, plan: dict[str, str],
                           say: Callable[[str], None]) -> Iterator[str]:
    """Holds the sweep's lock (a second start on this id exits 2 here) and yields its parent run, which
    ends KILLED or FAILED should the sweep end by an exception: a re-run sets it RUNNING again."""
    from perception.tracking import ensure_parent_run

    with sweep_lock(sweep_dir(sweep_id, home), sweep_id):
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
        body = f"FAILED (exit {out.returncode}) after {out.seconds:.1f} s{where}" + (f": {out.note}" if out.note else "")
    return head + body + f" · elapsed {_clock(elapsed)}" + (f" · ETA {_clock(eta)}" if n < total else "")


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
