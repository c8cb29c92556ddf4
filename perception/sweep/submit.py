"""Submits the A/B workflow to an Argo server through hera's WorkflowsService, or shows what would be
posted (`--dry-run`: rendered, validated strictly, nothing sent, no server or token needed).

The bearer token comes from ARGO_TOKEN only: a command-line argument would land in shell history
and in `ps` output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional

from perception.errors import ConfigError
from perception.sweep.argo_api import ArgoServer
from perception.sweep.argo_options import ArgoTarget
from perception.sweep.follow import FINISHED, SWEEP_ID_LABEL
from perception.sweep.render import build
from perception.sweep.schema import schema_errors


@dataclass
class Submitted:
    name: str
    namespace: str
    link: str


@dataclass
class DryRun:
    body: dict  # the request body `submit` would post: {"workflow": {...}}
    url: Optional[str]  # where it would post it; None without a server


def submit(
    target: ArgoTarget, smoke: bool = False, params: Optional[Mapping[str, str]] = None, token: Optional[str] = None
) -> Submitted:
    server = ArgoServer(target, token)
    w = _workflow(target, smoke, params)
    sweep_id = next((p.value for p in w.arguments if p.name == "sweep-id"), "")
    if sweep_id:  # continuing a sweep: labelled now, so a second submission sees it before the controller does
        refuse_if_running(server, sweep_id)
        w.labels = {**(w.labels or {}), SWEEP_ID_LABEL: sweep_id}
    built = w.build()
    check_strictly(request_body(built)["workflow"])
    name = server.create(built)
    return Submitted(name, target.namespace, server.link(name))


def dry_run(target: Optional[ArgoTarget], smoke: bool = False, params: Optional[Mapping[str, str]] = None) -> DryRun:
    """What `submit` would post, checked as `submit` checks it; the running-sweep check needs the
    server and is left out."""
    w = _workflow(target, smoke, params)
    sweep_id = next((p.value for p in w.arguments if p.name == "sweep-id"), "")
    if sweep_id:
        w.labels = {**(w.labels or {}), SWEEP_ID_LABEL: sweep_id}
    body = request_body(w.build())
    check_strictly(body["workflow"])
    url = f"{target.host}api/v1/workflows/{target.namespace}" if target else None
    return DryRun(body, url)


def _workflow(target: Optional[ArgoTarget], smoke: bool, params: Optional[Mapping[str, str]]):
    ui = {"argo-ui": target.host} if target else {}  # the gate links the parent run to the workflow's page
    w = build(smoke, {**ui, **(params or {})})
    if target:
        w.namespace = target.namespace
    return w


def request_body(built) -> dict:
    """The JSON hera's create_workflow posts for a built workflow."""
    from hera.workflows.models import WorkflowCreateRequest

    req = WorkflowCreateRequest(workflow=built)
    return json.loads(req.json(exclude_none=True, by_alias=True, exclude_unset=True, exclude_defaults=True))


def check_strictly(workflow: dict) -> None:
    errors = schema_errors(workflow)
    if errors:
        raise ConfigError(
            "the rendered workflow does not validate against the Argo schema: "
            + "; ".join(f"{where}: {message[:200]}" for where, message in errors[:5])
        )


def refuse_if_running(server: ArgoServer, sweep_id: str) -> None:
    """Two workflows training one sweep would write the same run directories."""
    found = server.list(label_selector=f"{SWEEP_ID_LABEL}={sweep_id},workflows.argoproj.io/completed!=true")
    running = [w for w in found if not (w.status and w.status.phase in FINISHED)]
    if running:
        names = ", ".join(f"{w.metadata.name} ({(w.status.phase if w.status else None) or 'Pending'})" for w in running)
        first = running[0].metadata.name
        raise ConfigError(
            f"--sweep-id {sweep_id}: {names} is still working on this sweep; wait for it "
            f"(perception-sweep status {first}) or stop it (perception-sweep stop {first}) first"
        )
