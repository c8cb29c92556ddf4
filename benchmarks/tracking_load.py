"""The tracking path under a study's load (DESIGN §6): N writer processes log what a training logs,
through the product's own tracking code (perception.tracking's ledger, perception.train's system
metrics and run record), to an `mlflow server` on a real PostgreSQL run as the cluster runs it
(--serve-artifacts, basic auth, 2 workers; perception/testing/postgres_server.py,
perception/testing/mlflow_server.py). Then
`perception-sweep sync`'s replay sends anything kept, the gate decides each study, and the UI's runs
view is queried.

A writer is one cell (arm x fold x replicate) of a three-arm study with three replicates: 27 writers
are one study, 81 three studies at once. Each writes what loop.py writes: the start (tags, every
config param), per-epoch metrics and diagnostics after each epoch (flushing after every step as the
loop does), MLflow's system metrics every interval, then the predictions and attention artifacts,
the log and config, and the end. Epochs are compressed (15 s, not minutes), system metrics at the
trainer's period (perception/train/sysmetrics.py; --system-interval-s sets another): the same
operations in the same order, epochs' operations sent faster than production sends them.

Faults (--fault): `server` SIGKILLs the tracking server's process group mid-way and starts it again
after --down-s; `postgres` SIGKILLs PostgreSQL (crash recovery on restart) the same way; `stall` stops
the server's processes (SIGSTOP) for --down-s and lets them go on, so requests queue on open connections
and the clients' timeouts and retries pile up behind them, as behind a starved server. The check
afterwards reads PostgreSQL and the artifact store directly: every recorded operation kept, and each
run's history (params but the commit's git_sha, tags, metrics by step, artifacts, status) digested, to
compare with the no-fault run's digests in the results file.

Writers start together by default (their epochs then end in the same second: the worst burst);
--stagger-s spreads their starts as pods' scheduling does; --busy-cores keeps cores busy beside them, as
other work on a shared node does. Afterwards `perception-sweep sync` runs as an operator runs it: again,
after a wait, while it reports operations it could not send.

    python benchmarks/tracking_load.py --writers 27 81 [--fault none|server|stall|postgres] [--stagger-s 15]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The table and the bar, not 81 processes' run URLs, download bars and monitor notices
os.environ.update(
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT="true",
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false",
    MLFLOW_LOGGING_LEVEL="WARNING",
)  # perception.testing's PostgreSQL and MLflow server, and its sweep predictions

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from tqdm import tqdm  # noqa: E402

from perception.contract import DIAGNOSTICS, SAMPLES_PER_S, val_auc  # noqa: E402
from perception.gitinfo import git_sha  # noqa: E402
from perception.paths import MLFLOW_EXPERIMENT  # noqa: E402
from perception.run_id import RunId, run_name  # noqa: E402
from perception.tracking import LEDGER, RunLedger, ensure_parent_run, replay_unsent  # noqa: E402
from perception.train import sysmetrics  # noqa: E402
from perception.train.compose import composed  # noqa: E402
from perception.train.config import apply_arm  # noqa: E402
from perception.train.params import flatten_config  # noqa: E402
from perception.train.run_record import RunRecord, write_config  # noqa: E402
from perception.testing.sweep_store import SweepSpec, fold_predictions  # noqa: E402
from perception.testing.mlflow_server import STORE_POOL, USERNAME, MlflowServer  # noqa: E402
from perception.testing.postgres_server import postgres  # noqa: E402

ARMS = ("shared", "per_horizon", "shared_skip")
FOLDS, REPLICATES = 3, 3
HORIZONS = [2, 5, 10, 20, 40]  # experiment=ci's
# Gaussian scores whose AUCs give the gate something to decide: per_horizon ahead at the long horizons
SPEC = SweepSpec(
    mu_a=[0.6] * 5,
    mu_b=[0.6, 0.6, 0.6, 0.7, 0.8],
    n_windows=1400,
    replicates=REPLICATES,
    extra_arms={"shared_skip": [0.6] * 5},
)
RESULTS = REPO / "benchmarks" / "results" / "tracking_load.json"


# ---------------------------------------------------------------- one writer (a training's tracking)


def cells(study: str) -> list[dict]:
    """Every (arm, fold, replicate) of a study, with the params and tags its training would log."""
    out = []
    for arm in ARMS:
        for fold in range(FOLDS):
            for rep in range(REPLICATES):
                overrides = [
                    "experiment=ci",
                    f"arm={arm}",
                    f"data.fold={fold}",
                    f"replicate={rep}",
                    f"sweep_id={study}",
                ]
                cfg = composed(overrides)
                apply_arm(cfg)
                cfg.seed = int(cfg.seed) + rep  # as place_of applies the replicate
                params = flatten_config(cfg)
                params.update(
                    git_sha=git_sha(), data_hash="tracking-load", sweep_id=study, experiment=str(cfg.experiment_name)
                )
                out.append(
                    {
                        "study": study,
                        "arm": arm,
                        "fold": fold,
                        "rep": rep,
                        "cfg": cfg,
                        "overrides": overrides,
                        "params": params,
                    }
                )
    return out


def epoch_metrics(cell: dict, epoch: int, epochs: int, preds: dict) -> dict[str, float]:
    """The keys loop.py logs each epoch, values a deterministic function of the cell and epoch."""
    from sklearn.metrics import roc_auc_score

    late = 0.01 * (epochs - 1 - epoch)  # earlier epochs a little worse; the last is the predictions' AUC
    values = {}
    for j, h in enumerate(HORIZONS):
        m = preds["mask"][:, j]
        values[val_auc(h)] = float(roc_auc_score(preds["labels"][m, j], preds["probs"][m, j])) - late
    values["val_auc_mean"] = float(np.mean(list(values.values())))
    values.update(train_loss=0.69 - 0.01 * epoch, val_loss=0.69 - 0.005 * epoch)
    values[SAMPLES_PER_S] = 1000.0 + 10 * ARMS.index(cell["arm"]) + epoch
    rng = np.random.default_rng([ARMS.index(cell["arm"]), cell["fold"], cell["rep"], epoch])
    values.update({k: float(v) for k, v in zip(DIAGNOSTICS, rng.random(len(DIAGNOSTICS)))})
    return values


def run_of(cell: dict) -> RunId:
    return RunId(cell["study"], cell["arm"], cell["fold"], cell["rep"])


def write_run(cell: dict, home: Path, uri: str, args: argparse.Namespace, png: bytes, out: Path) -> None:
    """One training's tracking, in its own process, as loop.py and run_record.py do it."""
    place = run_of(cell).directory(home)
    place.mkdir(parents=True, exist_ok=True)
    write_config(place, cell["cfg"], cell["overrides"])
    ledger = RunLedger(place, uri, MLFLOW_EXPERIMENT)
    sends: list[tuple[str, float]] = []  # (operation, seconds) per operation sent
    send = ledger._send

    def timed_send(entry: dict) -> None:
        t = time.perf_counter()
        send(entry)
        sends.append((entry["op"], time.perf_counter() - t))

    ledger._send = timed_send
    record = RunRecord(ledger, system_metrics=True)
    stalls: list[float] = []  # seconds each epoch's end held the training for tracking
    log = open(place / "train.log", "a")
    time.sleep(cell["delay_s"])  # pods start apart; 0: every writer at once, their epochs ending together
    try:
        tags = run_of(cell).tags()
        try:
            tags["mlflow.parentRunId"] = ensure_parent_run(cell["study"], uri, MLFLOW_EXPERIMENT)
        except Exception as exc:  # as loop.py: the ledger nests the run once it can
            log.write(f"no parent run yet: {exc}\n")
        ledger.record(
            "start",
            tags=tags,
            params=cell["params"],
            run_name=run_name(cell["arm"], cell["fold"], cell["rep"]),
            experiment=MLFLOW_EXPERIMENT,
        )
        ledger.flush(force=True)
        record.monitoring()
        record.send_in_background()
        preds = fold_predictions(SPEC, cell["fold"], cell["rep"])[cell["arm"]]
        for epoch in range(args.epochs):
            end = time.monotonic() + args.epoch_s
            while time.monotonic() < end:  # the training steps, each followed by loop.py's send
                time.sleep(args.step_s)
                record.send_soon()
            ledger.record("metrics", step=epoch, values=epoch_metrics(cell, epoch, args.epochs, preds))
            t = time.perf_counter()
            record.send_soon(force=True)  # beside the training since the background sender
            record.monitoring()  # the system metrics restarted where they stopped, as loop.py's epoch end
            stalls.append(time.perf_counter() - t)
            log.write(f"epoch {epoch + 1}/{args.epochs}\n")
            log.flush()
        for rel, payload in (
            ("predictions/val_final.npz", preds),
            ("diagnostics/attention_by_lag.npz", None),
            ("diagnostics/attention_by_lag.png", png),
        ):
            (place / rel).parent.mkdir(exist_ok=True)
            if rel.endswith(".png"):
                (place / rel).write_bytes(payload)
            elif payload is not None:
                np.savez(place / rel, **payload)
            else:
                np.savez(
                    place / rel,
                    lag_edges=np.array([0, 1, 2, 4, 8, 16, 32]),
                    mass=np.full((1, 6), 1 / 6, np.float32),
                    query_names=np.asarray(["shared"]),
                )
            ledger.record("artifact", path=rel, artifact_path=str(Path(rel).parent))
        log.close()
        t = time.perf_counter()
        ok = record.end("FINISHED")
        end_s = time.perf_counter() - t  # the end waits for a send in flight and sends the rest
    except BaseException as exc:
        out.write_text(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}))
        raise
    out.write_text(
        json.dumps(
            {
                "failed": None,
                "sends": sends,
                "stalls": stalls,
                "end_s": end_s,
                "all_sent": ok,
                "failures": ledger.failures(),
            }
        )
    )


# ---------------------------------------------------------------- the check: what the store kept


def stored(pg_dsn: str, artifacts: Path) -> dict[str, dict]:
    """Per run id, everything PostgreSQL and the artifact store hold, read directly."""
    import psycopg2

    runs: dict[str, dict] = {}
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_uuid, status FROM runs")
        for rid, status in cur.fetchall():
            runs[rid] = {"status": status, "params": {}, "tags": {}, "metrics": {}, "system": 0, "artifacts": set()}
        cur.execute("SELECT run_uuid, key, value FROM params")
        for rid, k, v in cur.fetchall():
            runs[rid]["params"][k] = v
        cur.execute("SELECT run_uuid, key, value FROM tags")
        for rid, k, v in cur.fetchall():
            runs[rid]["tags"][k] = v
        cur.execute("SELECT run_uuid, key, step, value FROM metrics")
        for rid, k, step, v in cur.fetchall():
            if k.startswith("system/"):
                runs[rid]["system"] += 1
            else:
                runs[rid]["metrics"].setdefault((k, step), []).append(v)
    for path in artifacts.rglob("*"):
        if path.is_file():
            parts = path.relative_to(artifacts).parts  # <experiment>/<run>/artifacts/<path...>
            if len(parts) > 3 and parts[1] in runs:
                runs[parts[1]]["artifacts"].add("/".join(parts[3:]))
    return runs


def check_run(place: Path, store: dict[str, dict]) -> dict:
    """Operations recorded in the run's ledger and kept in the store; the run's history digest."""
    ledger = RunLedger(place, "")
    entries, rid = ledger.entries(), ledger.run_id()
    got = store.get(rid)
    kept, lost = 0, []
    for e in entries:
        if got is None:
            lost.append(f"{e['op']} #{e['id']}")
            continue
        op = e["op"]
        if op == "start":
            ok = all(got["params"].get(k) == str(v) for k, v in e["params"].items()) and all(
                got["tags"].get(k) == v for k, v in e["tags"].items() if k != "mlflow.parentRunId"
            )
        elif op == "metrics":
            ok = all(got["metrics"].get((k, e["step"])) == [float(v)] for k, v in e["values"].items())
        elif op == "artifact":
            ok = f"{e['artifact_path']}/{Path(e['path']).name}" in got["artifacts"]
        elif op == "tags":
            ok = all(got["tags"].get(k) == str(v) for k, v in e["tags"].items())
        elif op == "end":
            ok = got["status"] == e["status"]
        else:
            ok = True  # status: superseded by the end
        kept += ok
        if not ok:
            lost.append(f"{op} #{e['id']}")
    history = None
    if got is not None:
        history = {
            "status": got["status"],
            "params": {k: v for k, v in got["params"].items() if k != "git_sha"},  # the commit, not the history
            "tags": {k: v for k, v in got["tags"].items() if not k.startswith("mlflow.")},
            "metrics": sorted((k, s, v) for (k, s), vs in got["metrics"].items() for v in vs),
            "artifacts": sorted(got["artifacts"]),
        }
    study = place.parent.name  # the sweep id: compared across runs as a placeholder
    text = json.dumps(history, sort_keys=True).replace(study, "<study>")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return {
        "recorded": len(entries),
        "kept": kept,
        "lost": lost,
        "digest": digest,
        "system_points": got["system"] if got else 0,
        "nested": bool(got and got["tags"].get("mlflow.parentRunId")),
    }


# ---------------------------------------------------------------- one load run


class Usage:
    """CPU seconds, peak resident memory and peak process count of a process tree, sampled (processes
    restart under faults). Every PSS_EVERY-th sample also sums the tree's proportional set size: resident
    memory with each shared page (PostgreSQL's shared buffers, a forked server's pages) split among the
    processes that map it, so the sum counts it once, as a pod's memory limit does."""

    PSS_EVERY = 4  # smaps of a hundred backends is not free on two cores

    def __init__(self):
        self.cpu_s, self.peak_rss, self.peak_pss, self.peak_procs, self._last, self._n = 0.0, 0, 0, 0, {}, 0

    def sample(self, root_pid) -> None:
        if root_pid is None:
            return
        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        with_pss, self._n = self._n % self.PSS_EVERY == 0, self._n + 1
        rss = pss = 0
        for p in procs:
            try:
                t = p.cpu_times()
                total = t.user + t.system
                self.cpu_s += max(0.0, total - self._last.get(p.pid, 0.0))
                self._last[p.pid] = total
                if with_pss:
                    full = p.memory_full_info()
                    rss, pss = rss + full.rss, pss + full.pss
                else:
                    rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(procs))


def python_loop_s(n: int = 10_000_000) -> float:
    """Seconds for one core to add n integers in Python: the server's speed differs across machines
    labelled alike, and its requests are Python, so each results file says how fast its cores were."""
    t, total = time.perf_counter(), 0
    for i in range(n):
        total += i
    return round(time.perf_counter() - t, 2)


def store_pool(setting: str) -> dict[str, str] | None:
    """--store-pool SIZE,OVERFLOW as MLflow's variables; "" leaves the test server's (STORE_POOL)."""
    if not setting:
        return None
    parts = [part.strip() for part in setting.split(",")]
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"--store-pool {setting!r}: expected SIZE,OVERFLOW, e.g. 5,10")
    return dict(zip(STORE_POOL, parts))  # the same variables, size then overflow


def load_run(n_writers: int, args: argparse.Namespace) -> dict:
    studies = [f"load{n_writers}-s{i}" for i in range(max(1, n_writers // len(ARMS) // FOLDS // REPLICATES))]
    all_cells = [c for s in studies for c in cells(s)][:n_writers]
    for i, c in enumerate(all_cells):  # spread evenly over --stagger-s, in a fixed order
        c["delay_s"] = args.stagger_s * i / len(all_cells)
    png = (REPO / "studies" / "results" / "gate_oc.png").read_bytes()  # a plot the size of the attention one
    sysmetrics.SAMPLING_INTERVAL_S = args.system_interval_s  # compressed cadence, read by each writer's monitor
    with tempfile.TemporaryDirectory(prefix="tracking-load-") as tmp, postgres(durable=True) as pg:
        tmp = Path(tmp)
        home = tmp / "home"
        password = secrets.token_hex(12)
        server = MlflowServer(
            tmp / "server",
            backend_store_uri=pg.uri("mlflow"),
            auth_database_uri=pg.uri("mlflow_auth"),
            password=password,
            workers=2,
            auth_cache_s=args.auth_cache_s,
            store_pool=store_pool(args.store_pool),
        )
        server.start()
        try:
            return _load(server, pg, tmp, home, password, studies, all_cells, png, args)
        finally:
            server.stop()


def _load(
    server,
    pg,
    tmp: Path,
    home: Path,
    password: str,
    studies: list[str],
    all_cells: list[dict],
    png: bytes,
    args: argparse.Namespace,
) -> dict:
    """Writers, the fault, replay, the check, the gate and the UI's view against a started server."""
    from mlflow.tracking import MlflowClient

    from perception.gate import inputs
    from perception.gate.inputs import GateRefusal, load_sweep
    from perception.gate.run import run_gate
    from perception.sweep.ui import prepare_view

    os.environ.update(PERCEPTION_HOME=str(home), MLFLOW_TRACKING_USERNAME=USERNAME, MLFLOW_TRACKING_PASSWORD=password)
    for s in studies:
        ensure_parent_run(s, server.uri, MLFLOW_EXPERIMENT)
    ctx = multiprocessing.get_context("fork")  # imported once; each writer its own process, as pods are
    outs = [tmp / f"writer-{i}.json" for i in range(len(all_cells))]
    procs = [
        ctx.Process(target=write_run, args=(c, home, server.uri, args, png, o), daemon=True)  # end with this one
        for c, o in zip(all_cells, outs)
    ]
    server_use, db_use = Usage(), Usage()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy_cores)]
    started = time.monotonic()
    for p in procs:
        p.start()
    expected_s = args.epochs * args.epoch_s + args.stagger_s
    fault_at, fault_done, down = started + args.fault_at * expected_s, args.fault == "none", []
    total_epochs = len(procs) * args.epochs
    bar = tqdm(total=total_epochs, desc=f"N={len(procs)} fault={args.fault}", unit="epoch")
    try:
        while any(p.is_alive() for p in procs):
            server_use.sample(server.pid())
            db_use.sample(pg.pid())
            done = sum(1 for c in all_cells for _ in _metrics_lines(run_of(c).directory(home)))
            bar.update(done - bar.n)
            if not fault_done and time.monotonic() >= fault_at:
                t = time.monotonic()
                if args.fault == "server":
                    server.kill()
                    time.sleep(args.down_s)
                    server.start()
                elif args.fault == "stall":  # connections stay open and queue, as behind a starved or paused server
                    os.killpg(server.pid(), signal.SIGSTOP)
                    time.sleep(args.down_s)
                    os.killpg(server.pid(), signal.SIGCONT)
                else:
                    pg.stop(fast=False)
                    time.sleep(args.down_s)
                    pg.start()
                down.append(round(time.monotonic() - t, 2))
                fault_done = True
            time.sleep(0.5)
    finally:  # other work on the node stops with the writers, before the sync
        for b in busy:
            b.kill()
            b.wait()
    bar.close()
    wall = time.monotonic() - started
    for p in procs:
        p.join()
    writers = [json.loads(o.read_text()) if o.exists() else {"failed": "no result"} for o in outs]

    t = time.monotonic()
    replayed, sync_runs, stuck = sync_as_an_operator(studies, home, server.uri, args)
    replay_s = time.monotonic() - t
    store = stored(pg.dsn("mlflow"), tmp / "server" / "artifacts")
    checks = {
        f"{c['study'].split('-s')[-1]}/{run_name(c['arm'], c['fold'], c['rep'])}": check_run(
            run_of(c).directory(home), store
        )
        for c in all_cells
    }

    client = MlflowClient(server.uri)
    gate_read_s: dict[int, list[float]] = {}
    readers_now = inputs.READERS
    for readers in (1, readers_now, 1, readers_now):  # run by run, as the gate read before, then at once
        inputs.READERS, t = readers, time.monotonic()
        try:
            load_sweep(client, server.uri, MLFLOW_EXPERIMENT, studies[0], optional_arms=["shared_skip"])
        except GateRefusal:
            pass  # timed all the same; the decision below says why
        gate_read_s.setdefault(readers, []).append(round(time.monotonic() - t, 2))
    inputs.READERS = readers_now
    decisions, gate_s = [], []
    for s in studies:
        t = time.monotonic()
        outcome = run_gate(s, server.uri, config_name="ci", out_dir=tmp / "gate" / s, progress=False)
        gate_s.append(time.monotonic() - t)
        decisions.append(outcome.decision or "refused: " + "; ".join(outcome.reasons)[:300])
    t = time.monotonic()
    view = prepare_view(client, MLFLOW_EXPERIMENT, studies[0])
    shown = client.search_runs([view.experiment_id], filter_string=view.search_filter, max_results=1000)
    ui_s = time.monotonic() - t

    by_op: dict[str, list[float]] = {}
    for w in writers:
        for op, seconds in w.get("sends", []):
            by_op.setdefault(op, []).append(seconds)
    sends = sorted(s for xs in by_op.values() for s in xs)
    stalls = sorted(s for w in writers for s in w.get("stalls", []))
    ends = sorted(w["end_s"] for w in writers if "end_s" in w)
    return {
        "writers": len(procs),
        "mlflow": importlib.metadata.version("mlflow"),  # server and clients: this environment's
        "fault": args.fault,
        "down_s": down,
        "wall_s": round(wall, 1),
        "failed_runs": sum(1 for w in writers if w.get("failed")),
        "failures": sorted({w["failed"] for w in writers if w.get("failed")})[:5],
        "send_errors_during_run": sum(len(w.get("failures", [])) for w in writers),
        "ops_recorded": sum(c["recorded"] for c in checks.values()),
        "ops_kept": sum(c["kept"] for c in checks.values()),
        "ops_lost": sum(len(c["lost"]) for c in checks.values()),
        "lost_examples": [f"{k}: {c['lost'][:3]}" for k, c in checks.items() if c["lost"]][:5],
        "ops_replayed_after": replayed,
        "replay_s": round(replay_s, 2),
        "sync_runs": sync_runs,
        "sync_stuck": stuck[:5],
        "runs_nested": sum(c["nested"] for c in checks.values()),
        "system_metric_points": sum(c["system_points"] for c in checks.values()),
        "ops_sent_timed": len(sends),
        "send_p50_s": round(_pct(sends, 50), 4),
        "send_p99_s": round(_pct(sends, 99), 4),
        "send_max_s": round(sends[-1], 4) if sends else None,
        "send_by_op": {
            op: {"n": len(xs), "p50_s": round(_pct(xs, 50), 4), "p99_s": round(_pct(xs, 99), 4)}
            for op, xs in sorted(by_op.items())
        },
        "epoch_end_held_p99_s": round(_pct(stalls, 99), 4),  # the send and the system metrics' restart
        "epoch_end_held_max_s": round(stalls[-1], 4) if stalls else None,
        "end_wait_p99_s": round(_pct(ends, 99), 4) if ends else None,  # a run's end: its last sends
        "server_cpu_cores": round(server_use.cpu_s / wall, 2),
        "server_peak_rss_mb": server_use.peak_rss // 2**20,
        "server_peak_pss_mb": server_use.peak_pss // 2**20,
        "db_cpu_cores": round(db_use.cpu_s / wall, 2),
        "db_peak_rss_mb": db_use.peak_rss // 2**20,
        "db_peak_pss_mb": db_use.peak_pss // 2**20,  # against the pod's memory limit (infra/k8s/base/postgres.yaml)
        "db_peak_processes": db_use.peak_procs,  # the postmaster, its helpers and a backend per connection
        "gate_read_sweep_s": min(gate_read_s[max(gate_read_s)]),
        "gate_read_sweep_by_readers_s": gate_read_s,
        "gate_s": [round(g, 2) for g in gate_s],
        "decisions": decisions,
        "ui_runs_view_s": round(ui_s, 2),
        "ui_runs_shown": len(shown),
        "digests": {k: c["digest"] for k, c in checks.items()},
    }


def sync_as_an_operator(studies: list[str], home: Path, uri: str, args) -> tuple[int, int, list[str]]:
    """`perception-sweep sync` on each study, run again after --sync-wait-s while it reports operations it
    could not send, at most --sync-runs times: what an operator does after an outage. Returns (operations
    sent, syncs run, what was still stuck after the last)."""
    sent, stuck = 0, {s: "" for s in studies}
    for attempt in range(1, args.sync_runs + 1):
        for s in list(stuck):
            try:
                sent += replay_unsent(s, home, uri)
                del stuck[s]
            except RuntimeError as exc:  # what could not be sent is still in the ledgers; run again
                stuck[s] = str(exc)[:400]
        if not stuck:
            return sent, attempt, []
        if attempt < args.sync_runs:
            time.sleep(args.sync_wait_s)
    return sent, args.sync_runs, [f"{s}: {why}" for s, why in stuck.items()]


def _metrics_lines(place: Path):
    path = place / LEDGER
    if path.exists():
        for line in path.read_text().splitlines():
            if '"op": "metrics"' in line:
                yield line


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


# ---------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, nargs="+", default=[27, 81])
    ap.add_argument("--fault", choices=["none", "server", "stall", "postgres"], default="none")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--epoch-s", type=float, default=15.0, help="seconds of 'training' per epoch")
    ap.add_argument("--step-s", type=float, default=0.05, help="seconds per training step (a flush after each)")
    ap.add_argument(
        "--system-interval-s",
        type=float,
        default=sysmetrics.SAMPLING_INTERVAL_S,
        help="system metrics sampling (default: the trainer's)",
    )
    ap.add_argument(
        "--fault-at", type=float, default=0.4, help="when the fault hits, as a fraction of the epochs' time"
    )
    ap.add_argument("--down-s", type=float, default=5.0, help="how long the killed or stopped server stays down")
    ap.add_argument(
        "--auth-cache-s",
        type=int,
        default=60,
        help="the auth app's credential cache, auth_cache_ttl_seconds (the cluster's: 60; 0: none)",
    )
    ap.add_argument(
        "--stagger-s",
        type=float,
        default=0.0,
        help="writers start spread over this many seconds (0: all at once, the worst case)",
    )
    ap.add_argument(
        "--busy-cores",
        type=int,
        default=0,
        help="processes that keep a core busy while the writers run (other work on the node)",
    )
    ap.add_argument("--sync-runs", type=int, default=5, help="`perception-sweep sync` runs at most, until all sent")
    ap.add_argument("--sync-wait-s", type=float, default=30.0, help="seconds between those runs")
    ap.add_argument(
        "--store-pool",
        type=lambda v: store_pool(v) and v or "",  # checked as it is parsed
        default="",
        help="the server's store pool as SIZE,OVERFLOW (5,10: SQLAlchemy's default; empty: the cluster's)",
    )
    ap.add_argument("--label", default="", help="a name for this configuration in the results file")
    args = ap.parse_args()

    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
    core_speed = python_loop_s()  # before the runs: their processes outlive them by a few seconds
    rows = []
    for n in args.writers:
        r = load_run(n, args)
        r["config"] = {k: v for k, v in vars(args).items() if k != "writers"}
        key = f"N={n} fault={args.fault}" + (f" {args.label}" if args.label else "")
        baseline = results["runs"].get(f"N={n} fault=none" + (f" {args.label}" if args.label else ""))
        if args.fault != "none" and baseline:
            same = [k for k in r["digests"] if r["digests"][k] == baseline["digests"].get(k)]
            r["histories_equal_no_fault"] = f"{len(same)}/{len(r['digests'])}"
            r["decisions_equal_no_fault"] = r["decisions"] == baseline["decisions"]
        results["runs"][key] = r
        rows.append((key, r))
    results["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_at_end": os.getloadavg(),
        "shared": "2 cores shared with other work",
        "python_loop_10m_s": core_speed,
    }
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")

    cols = (
        "writers",
        "failed_runs",
        "ops_recorded",
        "ops_kept",
        "ops_lost",
        "ops_replayed_after",
        "send_p50_s",
        "send_p99_s",
        "server_cpu_cores",
        "server_peak_rss_mb",
        "server_peak_pss_mb",
        "db_cpu_cores",
        "db_peak_rss_mb",
        "db_peak_pss_mb",
        "db_peak_processes",
        "gate_read_sweep_s",
        "ui_runs_view_s",
        "wall_s",
    )
    print("| run | " + " | ".join(cols) + " | decisions |")
    print("|---" * (len(cols) + 2) + "|")
    for key, r in rows:
        print(f"| {key} | " + " | ".join(str(r.get(c, "-")) for c in cols) + f" | {', '.join(r['decisions'])} |")
        for extra in (
            "send_by_op",
            "histories_equal_no_fault",
            "decisions_equal_no_fault",
            "lost_examples",
            "failures",
            "down_s",
            "sync_runs",
            "sync_stuck",
        ):
            if r.get(extra):
                print(f"  {extra}: {r[extra]}")
    print(f"machine: {results['machine']}; written {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
