"""Submits the A/B workflow to an Argo server through hera's WorkflowsService.

The bearer token comes from ARGO_TOKEN only: a command-line argument would land in shell history
and in `ps` output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from perception.errors import ConfigError
from perception.sweep.argo_api import ArgoServer
from perception.sweep.follow import FINISHED, SWEEP_ID_LABEL
from perception.sweep.render import build


@dataclass
class Submitted:
    name: str
    namespace: str
    link: str


def submit(host: str, namespace: str, smoke: bool = False, params: Optional[Mapping[str, str]] = None,
           token: Optional[str] = None, verify_ssl: bool = True) -> Submitted:
    server = ArgoServer(host, namespace, token, verify_ssl)
    w = build(smoke, {"argo-ui": server.host, **(params or {})})  # the gate links the parent run to the UI
    w.namespace = namespace
    sweep_id = next((p.value for p in w.arguments if p.name == "sweep-id"), "")
    if sweep_id:  # continuing a sweep: labelled now, so a second submission sees it before the controller does
        refuse_if_running(server, sweep_id)
        w.labels = {**(w.labels or {}), SWEEP_ID_LABEL: sweep_id}
    name = server.create(w.build())
    return Submitted(name, namespace, server.link(name))


def refuse_if_running(server: ArgoServer, sweep_id: str) -> None:
    """Two workflows training one sweep would write the same run directories."""
    found = server.list(label_selector=f"{SWEEP_ID_LABEL}={sweep_id},workflows.argoproj.io/completed!=true")
    running = [w for w in found if not (w.status and w.status.phase in FINISHED)]
    if running:
        names = ", ".join(f"{w.metadata.name} ({(w.status.phase if w.status else None) or 'Pending'})" for w in running)
        first = running[0].metadata.name
        raise ConfigError(f"--sweep-id {sweep_id}: {names} is still working on this sweep; wait for it "
                          f"(perception-sweep status {first}) or stop it (perception-sweep stop {first}) first")
