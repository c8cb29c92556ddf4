"""MLflow plumbing shared by every command: experiments, the sweep's parent run, and a durable
ledger so that a training run survives a tracking-server outage without losing anything.

Every tracking operation of a run (start, metrics, artifacts, status, end) is first appended to
`tracking.jsonl` in the run directory, then sent; ids of sent operations go to `tracking_sent.jsonl`.
Whatever could not be sent is replayed later, in order, by the resumed run, by `recover_sweep` before a
sweep or its gate decides (re-running the sweep recovers an outage), or by `perception-sweep sync`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from perception.contract import ROLE, ROLE_SWEEP, ROLE_TRAIN, SWEEP_ID
from perception.errors import ConfigError
from perception.paths import MLFLOW_EXPERIMENT as DEFAULT_EXPERIMENT, inside, perception_home, sweep_dir
from perception.paths import tracking_uri as resolve_tracking_uri

LEDGER = "tracking.jsonl"
SENT = "tracking_sent.jsonl"
RUN_ID_FILE = "mlflow_run.json"
SYNC_RUNS_SHOWN = 5  # a study's 27 runs stuck behind one outage say the same: the first few, then a count

# Short HTTP retries: a training run must not stall for minutes on each call while the server is down;
# the ledger retries later with backoff instead.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
# Pods have no route out; MLflow's telemetry thread also races client calls in short-lived processes.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def client(uri: Optional[str] = None):
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(uri)
    _create_store_once(uri)
    return MlflowClient(tracking_uri=uri)


_CREATED: set[str] = set()


def _create_store_once(uri: str) -> None:
    """Processes that open a new sqlite store at once race on creating its tables (alembic: "Online
    migration expected to match one row"): sweeps started side by side on one PERCEPTION_HOME. The
    first to take the lock creates them, the others then find them made. fcntl, unlike perception.locks,
    because a sqlite store is a file on a local disk (sqlite itself needs one)."""
    if not uri.startswith("sqlite:///") or uri in _CREATED:
        return
    import fcntl

    from mlflow.tracking import MlflowClient

    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.create-lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates or migrates the tables
    _CREATED.add(uri)


def _is_local_store(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:", "/")) or "://" not in uri


def get_or_create_experiment(name: str, uri: Optional[str] = None) -> str:
    """Experiment id by name; a local store keeps its artifacts under PERCEPTION_HOME, not the cwd."""
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(uri)
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if _is_local_store(uri):
        location = (perception_home() / "mlartifacts").as_uri()
    try:
        return c.create_experiment(name, artifact_location=location)
    except MlflowException:
        exp = c.get_experiment_by_name(name)  # created concurrently by a sibling run
        if exp is None:
            raise
        return exp.experiment_id


def ensure_parent_run(
    sweep_id: str,
    tracking_uri: Optional[str] = None,
    experiment: str = DEFAULT_EXPERIMENT,
    first_tags: Optional[dict[str, str]] = None,
) -> str:
    """Finds or creates the sweep's parent run (tags role=sweep, sweep_id); returns its run id.
    `first_tags` are set only where the parent lacks them: a pre-registered plan is never rewritten."""
    uri = resolve_tracking_uri(tracking_uri)
    exp_id = get_or_create_experiment(experiment, uri)
    c = client(uri)
    found = c.search_runs(
        [exp_id],
        filter_string=f"tags.{SWEEP_ID} = '{sweep_id}' and tags.{ROLE} = '{ROLE_SWEEP}'",
        order_by=["attributes.start_time DESC"],  # the latest, as the gate reads it
        max_results=1,
    )
    if found:
        if found[0].info.status != "RUNNING":  # a sweep continued after its gate ended the parent
            c.update_run(found[0].info.run_id, status="RUNNING")
        for key, value in (first_tags or {}).items():
            if key not in found[0].data.tags:
                c.set_tag(found[0].info.run_id, key, value)
        return found[0].info.run_id
    run = c.create_run(exp_id, tags={**(first_tags or {}), SWEEP_ID: sweep_id, ROLE: ROLE_SWEEP}, run_name=sweep_id)
    return run.info.run_id


def parent_run_tags(
    sweep_id: str, tracking_uri: Optional[str] = None, experiment: str = DEFAULT_EXPERIMENT
) -> dict[str, str]:
    """The tags of the sweep's parent run, {} while it has none; creates and changes nothing."""
    c = client(resolve_tracking_uri(tracking_uri))
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    found = c.search_runs(
        [exp.experiment_id],
        max_results=1,
        order_by=["attributes.start_time DESC"],
        filter_string=f"tags.{SWEEP_ID} = '{sweep_id}' and tags.{ROLE} = '{ROLE_SWEEP}'",
    )
    return dict(found[0].data.tags) if found else {}


def settle_parent(c, run_id: str) -> Optional[str]:
    """Sets the parent of training run `run_id` to what its trainings say: RUNNING while any of them
    runs, else FAILED if any failed, KILLED if any was killed, FINISHED otherwise; returns that status
    (None: no parent). What a standalone `perception-train` does at its start and end, so that no parent
    claims to run after its trainings ended (a sweep runner's parent is ended by the gate instead)."""
    run = c.get_run(run_id)
    parent = run.data.tags.get("mlflow.parentRunId")
    try:
        if not parent or c.get_run(parent).info.lifecycle_stage == "deleted":
            return None
    except Exception as exc:  # a parent deleted for good: nothing to settle; the server down: kept for later
        if getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    children, token = [], None
    while True:  # every training nested under it, paged
        page = c.search_runs(
            [run.info.experiment_id],
            max_results=1000,
            page_token=token,
            filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.{ROLE} = '{ROLE_TRAIN}'",
        )
        children += page
        token = page.token
        if not token:
            break
    said = {r.info.status for r in children} | {run.info.status}
    status = next((s for s in ("RUNNING", "FAILED", "KILLED") if s in said), "FINISHED")
    if c.get_run(parent).info.status != status:
        if status == "RUNNING":
            c.update_run(parent, status=status)
        else:
            c.set_terminated(parent, status=status)
    return status


@dataclass
class RunLedger:
    """The durable record of one training run's tracking operations, in its run directory."""

    run_dir: Path
    tracking_uri: str
    experiment: str = DEFAULT_EXPERIMENT
    _next_attempt: float = 0.0
    _backoff: float = 1.0
    _failures: list[str] = field(default_factory=list)
    _pending: bool = True  # the files may hold unsent entries; False once a flush sent them all
    _recorded: int = 0  # entries recorded by this object: a flush that began before one leaves _pending set
    # one flush at a time: a background send and the run's final flush never send the same entry twice
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # ---- recording -------------------------------------------------------------------------
    def record(self, op: str, **payload: Any) -> None:
        entry = {"id": self._next_id(), "op": op, "time_ms": int(time.time() * 1000), **payload}
        _append_line(self.run_dir / LEDGER, entry)
        self._recorded += 1
        self._pending = True

    def started(self) -> bool:
        """A start was recorded: there is (or will be, once sent) an MLflow run to end."""
        return any(e["op"] == "start" for e in self.entries())

    def has_metrics_for(self, step: int) -> bool:
        return any(e["op"] == "metrics" and e["step"] == step for e in self.entries())

    def entries(self) -> list[dict]:
        return _read_lines(self.run_dir / LEDGER)

    def sent_ids(self) -> set[int]:
        return {e["id"] for e in _read_lines(self.run_dir / SENT)}

    def unsent(self) -> list[dict]:
        sent = self.sent_ids()
        return [e for e in self.entries() if e["id"] not in sent]

    def run_id(self) -> Optional[str]:
        path = self.run_dir / RUN_ID_FILE
        return json.loads(path.read_text())["run_id"] if path.exists() else None

    def forget_run(self) -> None:
        """The MLflow run is gone: the next flush sends the whole ledger into a new one. The old run id
        and the record of what it received are kept aside, renamed, not deleted."""
        old = self.run_id() or "none"
        for name in (RUN_ID_FILE, SENT):
            path = self.run_dir / name
            if path.exists():
                os.replace(path, path.with_name(f"{path.stem}.missing-{old}{path.suffix}"))
        self._pending = True

    # ---- sending ---------------------------------------------------------------------------
    def flush(self, force: bool = False) -> bool:
        """Sends unsent operations in order. On failure keeps them, backs off (1 s doubling to
        60 s) and returns False; training goes on meanwhile."""
        if not self._pending:  # nothing recorded since everything was sent: no file reads per batch
            return True
        with self._lock:
            if not force and time.monotonic() < self._next_attempt:
                return False
            recorded = self._recorded
            for entry in self.unsent():
                try:
                    self._send(entry)
                except Exception as exc:  # any transport or server error: keep the entry for later
                    self._failures.append(f"{entry['op']} #{entry['id']}: {type(exc).__name__}: {exc}"[:300])
                    self._next_attempt = time.monotonic() + self._backoff
                    self._backoff = min(self._backoff * 2, 60.0)
                    return False
                _append_line(self.run_dir / SENT, {"id": entry["id"]})
            self._backoff = 1.0
            self._pending = self._recorded != recorded  # recorded meanwhile: maybe not read by this flush
            return True

    def failures(self) -> list[str]:
        return list(self._failures)

    def resend_all(self) -> None:
        """Every entry sent again, in order, sent or not: for an MLflow run that did not keep all of it
        (MLflow takes the repeats idempotently). Raises on the first failure."""
        for entry in self.entries():
            self._send(entry)

    def failed(self, what: str, exc: BaseException) -> None:
        """Records a failure of recovery work done beside flush (its last line is what sync reports)."""
        self._failures.append(f"{what}: {type(exc).__name__}: {exc}"[:300])

    def _send(self, entry: dict) -> None:
        from mlflow.entities import Metric, Param, RunTag

        c = client(self.tracking_uri)
        op = entry["op"]
        if op == "start":
            if self.run_id() is None:
                exp_id = get_or_create_experiment(self.experiment, self.tracking_uri)
                tags = dict(entry["tags"])
                if "mlflow.parentRunId" not in tags:  # started during an outage: nest it now
                    tags["mlflow.parentRunId"] = ensure_parent_run(tags[SWEEP_ID], self.tracking_uri, self.experiment)
                run = c.create_run(exp_id, tags=tags, run_name=entry.get("run_name"))
                _write_json(self.run_dir / RUN_ID_FILE, {"run_id": run.info.run_id})
                existing = {}  # a run just created has none: one request fewer when a study's runs start at once
            else:  # sent before, maybe in part: params already there are skipped (MLflow refuses to change one)
                c.update_run(self.run_id(), status="RUNNING")
                existing = c.get_run(self.run_id()).data.params
            run_id = self.run_id()
            params = [Param(k, v) for k, v in entry["params"].items() if k not in existing]
            for chunk in _chunks(params, 100):
                c.log_batch(run_id, params=chunk)
            return
        run_id = self.run_id()
        if run_id is None:
            raise RuntimeError("run not created yet")
        if op == "metrics":
            metrics = [Metric(k, float(v), entry["time_ms"], entry["step"]) for k, v in entry["values"].items()]
            c.log_batch(run_id, metrics=metrics)
        elif op == "artifact":
            c.log_artifact(run_id, str(self._artifact_path(entry)), entry.get("artifact_path"))
        elif op == "tags":
            c.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in entry["tags"].items()])
        elif op == "status":  # a resumed run is alive again after an attempt that ended KILLED/FAILED
            c.update_run(run_id, status=entry["status"])
        elif op == "end":
            c.set_terminated(run_id, status=entry["status"], end_time=entry["time_ms"])
        elif op == "settle_parent":
            settle_parent(c, run_id)
        else:
            raise ValueError(f"unknown ledger operation {op!r} in {self.run_dir / LEDGER}")

    def _artifact_path(self, entry: dict) -> Path:
        """The file an artifact entry names: read from the ledger, so never trusted to stay in the run."""
        try:
            return inside(self.run_dir / str(entry["path"]), self.run_dir, "")
        except ConfigError:
            raise ConfigError(
                f"{LEDGER} #{entry['id']}: artifact path {entry['path']!r} lies outside the run directory; not uploaded"
            ) from None

    def _next_id(self) -> int:
        entries = self.entries()
        return entries[-1]["id"] + 1 if entries else 0


class BackgroundSender:
    """Sends a ledger on a thread of its own while a training runs, so that a slow or restarting server
    delays the run's record, never its training (the ledger keeps every operation meanwhile). `soon()`
    asks for a send and returns at once; after `close()` the run's final flush waits for a send in
    flight (the ledger's lock), never runs beside it."""

    def __init__(self, ledger: RunLedger):
        self.ledger = ledger
        self._wake = threading.Event()
        self._force = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"tracking-{ledger.run_dir.name}", daemon=True)
        self._thread.start()

    def soon(self, force: bool = False) -> None:
        """A send as soon as the thread is free; `force` ignores the backoff of an outage."""
        if not self.ledger._pending:  # nothing recorded since the last send: no wake-up per training step
            return
        self._force = self._force or force
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            force, self._force = self._force, False
            try:
                self.ledger.flush(force=force)
            except Exception as exc:  # flush keeps transport errors itself; anything else is reported, not fatal
                self.ledger.failed("background send", exc)


@dataclass
class Recovery:
    """What `recover_sweep` did: operations sent, one line per run it completed, one per run it could not."""

    sent: int = 0
    completed: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)


def recover_sweep(
    sweep_id: str, home: Optional[Path] = None, tracking_uri: Optional[str] = None, any_store: bool = False
) -> Recovery:
    """Makes MLflow hold what the sweep's run directories hold, before anything decides on it: every
    run's kept operations are sent in order, and a finished run (done.json) whose MLflow run is missing
    or not ended as its ledger says is completed from its ledger. A run training now (its lock held)
    sends its own and is left alone, and so is a run whose ledger was made for another tracking store
    unless `any_store` (an explicit `perception-sweep sync --tracking-uri`: the server moved). Nothing
    here raises for the server: what could not be sent is in `stuck`, kept for the next attempt."""
    from perception.locks import LockHeld, run_lock
    from perception.paths import DONE_FILE

    root = sweep_dir(sweep_id, home)
    out = Recovery()
    if not root.is_dir():
        return out
    uri = resolve_tracking_uri(tracking_uri)
    for run_dir in sorted(p for p in root.iterdir() if (p / LEDGER).exists()):
        if not _inside_sweep(run_dir, root):
            out.stuck.append(f"{run_dir.name}: resolves to {run_dir.resolve()}, outside {root}; left alone")
            continue
        ledger = RunLedger(run_dir, uri, _experiment_of(run_dir))
        recorded = _start_of(run_dir).get("store")
        if not any_store and recorded is not None and recorded != store_identity(uri):  # never copied unasked
            out.stuck.append(
                f"{run_dir.name}: trained against the tracking store {recorded}, not "
                f"{store_identity(uri)}; left alone (`perception-sweep sync --tracking-uri` sends "
                f"it to a store named explicitly)"
            )
            continue
        try:
            with run_lock(run_dir, sweep_id):  # a run training now sends its own: never twice
                before = len(ledger.unsent())
                ok = ledger.flush(force=True)
                out.sent += before - len(ledger.unsent())
                if ok and (run_dir / DONE_FILE).exists():
                    ok = _complete_finished(ledger, out)
        except LockHeld as exc:
            out.stuck.append(f"{run_dir.name}: {exc}")
            continue
        if not ok:
            out.stuck.append(
                f"{run_dir.name}: {len(ledger.unsent())} operation(s) kept "
                f"({(ledger.failures() or ['unreachable'])[-1]})"
            )
    return out


def _complete_finished(ledger: RunLedger, out: Recovery) -> bool:
    """A finished run whose ledger is all sent: its MLflow run must exist and have ended as recorded.
    Missing (deleted, or a store that lost it): a new run from the whole ledger, the old id kept aside.
    Another status (left RUNNING): the ledger sent again into it, which MLflow takes idempotently
    (params already there are skipped, an identical metric is stored once, artifacts are replaced)."""
    ended = [e["status"] for e in ledger.entries() if e["op"] == "end"]
    run_id = ledger.run_id()
    try:
        run = client(ledger.tracking_uri).get_run(run_id) if run_id else None
    except Exception as exc:  # MLflow's "no such run", or the server unreachable
        if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
            ledger.failed(f"checking run {run_id}", exc)
            return False
        run = None
    try:
        if run is None or run.info.lifecycle_stage == "deleted":
            ledger.forget_run()
            ok = ledger.flush(force=True)
            if ok:
                out.sent += len(ledger.entries())
                out.completed.append(
                    f"{ledger.run_dir.name}: its MLflow run {run_id} is missing; recreated from its "
                    f"ledger as run {ledger.run_id()}"
                )
            return ok
        if ended and run.info.status != ended[-1]:
            ledger.resend_all()
            out.completed.append(
                f"{ledger.run_dir.name}: run {run_id} was {run.info.status}; completed from its ledger ({ended[-1]})"
            )
    except Exception as exc:  # any transport or server error: the next attempt does it again
        ledger.failed(f"completing run {run_id}", exc)
        return False
    return True


def replay_unsent(sweep_id: str, home: Optional[Path] = None, tracking_uri: Optional[str] = None) -> int:
    """`perception-sweep sync`: `recover_sweep` into the store it is given, whichever the runs were made
    for, raising RuntimeError listing what still could not be sent; returns how many operations were sent."""
    root = sweep_dir(sweep_id, home)
    if not root.is_dir():
        raise FileNotFoundError(f"no runs for sweep_id {sweep_id!r} under {root}")
    recovery = recover_sweep(sweep_id, home, tracking_uri, any_store=True)
    if recovery.stuck:
        shown, rest = recovery.stuck[:SYNC_RUNS_SHOWN], len(recovery.stuck) - SYNC_RUNS_SHOWN
        raise RuntimeError(
            f"sweep {sweep_id}: {len(recovery.stuck)} run(s) could not be brought up to date "
            f"({recovery.sent} operation(s) sent); what was not sent stays in their run directories, and "
            f"`perception-sweep sync --sweep-id {sweep_id}` again sends it once the cause is gone: "
            + "; ".join(shown)
            + (f"; and {rest} more run(s)" if rest > 0 else "")
        )
    return recovery.sent


def _inside_sweep(run_dir: Path, root: Path) -> bool:
    """A run directory found in the sweep's folder is read only where it really is there (not a link out)."""
    try:
        inside(run_dir, root, run_dir.name)
        return True
    except ConfigError:
        return False


def kept_operations(sweep_id: str, home: Optional[Path] = None) -> dict[str, int]:
    """Per run directory of the sweep, how many of its tracking operations MLflow has not received."""
    root = sweep_dir(sweep_id, home)
    if not root.is_dir():
        return {}
    counts = {
        p.name: len(RunLedger(p, "").unsent())
        for p in sorted(root.iterdir())
        if (p / LEDGER).exists() and _inside_sweep(p, root)
    }
    return {name: n for name, n in counts.items() if n}


def store_identity(uri: str) -> str:
    """The tracking store a URI names, without credentials (a ledger is a plain file): scheme, host,
    port and path."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if not parts.scheme or not parts.netloc:
        return uri if "@" not in uri else uri.rsplit("@", 1)[1]
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"


def _start_of(run_dir: Path) -> dict:
    return next((e for e in _read_lines(run_dir / LEDGER) if e["op"] == "start"), {})


def _experiment_of(run_dir: Path) -> str:
    return _start_of(run_dir).get("experiment", DEFAULT_EXPERIMENT)


def _append_line(path: Path, obj: dict) -> None:
    """One JSON line per write, flushed and fsynced: a kill leaves at most a torn last line,
    which the reader skips."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(obj, sort_keys=True) + "\n"
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line  # close a torn line so this entry stands on its own
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a killed writer
    return out


def _write_json(path: Path, obj: dict) -> None:
    from perception.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def _chunks(items: list, n: int) -> Iterable[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
