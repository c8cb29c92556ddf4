"""`perception-sweep ui`: the MLflow UI opened on one sweep's training runs, folds side by side.

Opened plainly, MLflow 3.17's UI shows an experiment's GenAI overview ("Traces 0"), its runs view one
collapsed parent row with no metric or tag columns, and its charts the system metrics. What MLflow
lets a URL and the experiment's tags preset, this sets:

- a saved view, as the UI's own "Save & share view" stores one: the experiment tag
  `mlflow.sharedViewState.<key>` holds {name, createdAt, updatedAt, state}, the state the runs page's
  JSON (filter, sort, columns and their order, grouping, a filter on the charts' names), and
  `#/experiments/<id>/runs?viewStateShareKey=<key>` opens it; it is also listed in the UI's "Views" menu.
  Two per sweep: grouped by `fold` (each fold's arms next to each other, paired as the gate pairs them;
  the link printed first) and by `variant` (a group row is the arm's mean over folds and replicates,
  what the gate compares).
  The URL carries no search parameter beside the key: with one, the UI ignores the view;
- `workflowType=machine_learning` in the URL: the UI in its "Model training" mode, whose experiment page
  is the runs view. Its default, kept per browser, is GenAI; the experiment tag
  `mlflow.experimentKind = custom_model_development` does not change that (MLflow 3.17.2 in headless
  Chromium opens the GenAI overview from a plain experiment link with or without it), so it is not
  set.

The columns: the deciding horizons' `val_auc` first (those the parent run's gate plan weighs), right
after the run's name, since the UI's assistant panel, open by default on a local server, covers the
right third of a 1280 px screen; then the identity tags and the other horizons.

What it cannot preset: closing the assistant panel or the shared-view banner, a table with one row per
fold and one column per arm (the UI groups rows, it does not pivot them: the gate logs per-fold tables
with B − A to the parent run, `comparison/`), rounded values (`columnWidths` is honoured, but a metric
shows all its digits, cut at the column's width), or the charts' layout beyond a filter on
their names (the UI builds its default charts from the metrics it finds; `val_auc` keeps the AUC ones).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import quote, urlencode, urlsplit

from perception.errors import ConfigError, PerceptionError
from perception.gate.study import PLAN_TAG
from perception.paths import check_sweep_id

SHARE_TAG_PREFIX, SHARE_URL_PARAM = "mlflow.sharedViewState.", "viewStateShareKey"
# the shared views, one per grouping; the first is the link to open first: each fold's arms side by side
GROUPINGS = ("fold", "variant")
IDENTITY_TAGS = ("variant", "fold", "replicate")
SUMMARY_METRICS = ("val_auc_mean", "val_loss")
AUC_METRIC = re.compile(r"^val_auc_h(\d+)$")
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SweepView:
    experiment_id: str
    sweep_id: str
    search_filter: str
    horizons: list[int]  # the deciding horizons first, as the columns run
    share_keys: dict[str, str]  # grouping -> share key
    deciding: tuple[int, ...] = ()  # the horizons the pre-registered plan weighs
    parent_run_id: Optional[str] = None

    def comparison_url(self, base: str) -> Optional[str]:
        """The parent run's artifacts: the gate's per-fold tables and auc_by_horizon.png."""
        if self.parent_run_id is None:
            return None
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.parent_run_id}/artifacts"

    def url(self, base: str, grouping: str = GROUPINGS[0]) -> str:
        """The runs page of this sweep with the shared view of `grouping`."""
        # the view carries the filter: with a search parameter in the URL beside it, the UI ignores the view
        query = urlencode(
            {SHARE_URL_PARAM: self.share_keys[grouping], "workflowType": "machine_learning"}, quote_via=quote
        )
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs?{query}"


def training_filter(sweep_id: str) -> str:
    """The MLflow search filter of a sweep's training runs (its parent and gate runs left out)."""
    return f"tags.sweep_id = '{sweep_id}' AND tags.role = 'train'"


def prepare_view(client, experiment: str, sweep_id: Optional[str]) -> SweepView:
    """Finds the sweep (default: the latest) and writes its saved views into the experiment's tags;
    returns what the URLs are made of."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(
            f"--mlflow-experiment {experiment!r}: no such MLflow experiment at {client.tracking_uri} "
            "(run a sweep first, or pass --tracking-uri)"
        )
    sweep_id = sweep_id or _latest_sweep(client, exp.experiment_id, experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=training_filter(sweep_id), max_results=1000)
    if not runs:
        raise ConfigError(
            f"--sweep-id {sweep_id!r}: no training runs of that sweep in experiment {experiment!r} "
            f"at {client.tracking_uri}"
        )
    horizons = sorted({int(m.group(1)) for r in runs for k in r.data.metrics if (m := AUC_METRIC.match(k))})
    parent = _parent_run(client, exp.experiment_id, sweep_id)
    deciding = tuple(h for h in _planned_weights(parent) if h in horizons)
    horizons = [*deciding, *(h for h in horizons if h not in deciding)]  # the columns that decide come first
    view = SweepView(
        exp.experiment_id,
        sweep_id,
        training_filter(sweep_id),
        horizons,
        {g: f"perception.{sweep_id}.by-{g}" for g in GROUPINGS},
        deciding,
        parent.info.run_id if parent else None,
    )
    now_ms = int(time.time() * 1000)
    for grouping, key in view.share_keys.items():
        state = json.dumps(view_state(view.search_filter, horizons, grouping, deciding), separators=(",", ":"))
        envelope = {"name": f"sweep {sweep_id} by {grouping}", "createdAt": now_ms, "updatedAt": now_ms, "state": state}
        client.set_experiment_tag(exp.experiment_id, SHARE_TAG_PREFIX + key, json.dumps(envelope))
    return view


def view_state(search_filter: str, horizons: list[int], grouping: str, deciding: Sequence[int] = ()) -> dict:
    """The runs page's state as the UI shares it: search facets plus its UI state (every field, since
    the UI replaces its state with what it reads). The deciding horizons' columns come first, right
    after the run's name: at 1280 px the UI's assistant panel, open by default, hides what lies further
    right (MLflow 3.17.2; tests/sweep/test_ui_browser.py checks it in headless Chromium)."""
    first = [_column("metrics", f"val_auc_h{h}") for h in deciding]
    columns = (
        first
        + [_column("tags", t) for t in IDENTITY_TAGS]
        + [_column("metrics", f"val_auc_h{h}") for h in horizons if h not in deciding]
        + [_column("metrics", m) for m in SUMMARY_METRICS]
    )
    return {
        "searchFilter": search_filter,
        "orderByKey": _column("tags", "fold"),
        "orderByAsc": True,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {},
        "runsExpanded": {},
        "runsPinned": [],
        "runsHidden": [],
        "runsVisibilityMap": {},
        "runsHiddenMode": "SHOW_ALL",
        "viewMaximized": False,
        "runListHidden": False,
        "isAccordionReordered": False,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": grouping}]},
        "groupsExpanded": {},
        "useGroupedValuesInCharts": False,
        "hideEmptyCharts": True,
        "autoRefreshEnabled": True,
        "chartsSearchFilter": "val_auc",
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def _column(kind: str, name: str) -> str:
    """A column as the UI names it: kind.`name`."""
    return f"{kind}.`{name}`"


def _parent_run(client, experiment_id: str, sweep_id: str):
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.sweep_id = '{sweep_id}' AND tags.role = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0] if found else None


def _planned_weights(parent) -> list[int]:
    """The horizons the sweep's pre-registered gate plan weighs (rule 1's), heaviest first; none when
    the parent has no readable plan."""
    try:
        weights = json.loads(parent.data.tags[PLAN_TAG])["settings"]["weights"] if parent else {}
        return [int(h) for h, w in sorted(weights.items(), key=lambda kv: -float(kv[1])) if float(w) > 0]
    except (KeyError, ValueError, TypeError, AttributeError):
        return []


def _latest_sweep(client, experiment_id: str, experiment: str) -> str:
    parents = client.search_runs(
        [experiment_id], filter_string="tags.role = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1
    )
    if not parents or "sweep_id" not in parents[0].data.tags:
        raise ConfigError(
            f"no sweep in experiment {experiment!r} at {client.tracking_uri}: "
            "run one first (perception-sweep local), or pass --sweep-id"
        )
    latest = parents[0]  # a tag read from the store goes into a filter: checked like a typed id
    return check_sweep_id(latest.data.tags["sweep_id"], f"tag sweep_id of the latest sweep's run {latest.info.run_id}")


# ---------------------------------------------------------------- the server


def is_server(uri: str) -> bool:
    return urlsplit(uri).scheme in ("http", "https")


def serve(store_uri: str, host: str, port: int, artifacts: Path, log: Path) -> subprocess.Popen:
    """Starts `mlflow server` on a local store, in its own process group and writing to `log`;
    returns once it answers."""
    _check_port_free(host, port)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store_uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--default-artifact-root",
        artifacts.as_uri(),
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # a viewer needs no job workers
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://{host}:{port}", proc, log)
    except BaseException:
        stop(proc)
        raise
    return proc


def _check_port_free(host: str, port: int) -> None:
    """A server already there would answer our health check in place of ours."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"--port {port}: {host}:{port} is in use ({exc.strerror}); pick another with --port, "
                "or point at a running server with --tracking-uri http://…"
            ) from exc


def stop(proc: subprocess.Popen) -> None:
    """Ends a server started in its own process group, with its workers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def wait_healthy(base: str, proc: subprocess.Popen, log: Path) -> None:
    """Returns once the server at `base` answers /health; raises if it exits or never answers."""
    import requests

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PerceptionError(
                f"mlflow server exited with {proc.returncode} before answering; its log {log}:\n"
                + log.read_text(errors="replace")[-2000:]
            )
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise PerceptionError(f"mlflow server at {base} did not answer within {START_TIMEOUT_S:.0f} s; its log {log}")
