"""Submits the A/B workflow to an Argo server through hera's WorkflowsService.

The bearer token comes from ARGO_TOKEN only: a command-line argument would land in shell history
and in `ps` output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from perception.sweep.argo_api import ArgoServer
from perception.sweep.render import build


@dataclass
class Submitted:
    name: str
    namespace: str
    link: str


def submit(host: str, namespace: str, smoke: bool = False, params: Optional[Mapping[str, str]] = None,
           token: Optional[str] = None, verify_ssl: bool = True) -> Submitted:
    server = ArgoServer(host, namespace, token, verify_ssl)
    w = build(smoke, params)
    w.namespace = namespace
    name = server.create(w.build())
    return Submitted(name, namespace, server.link(name))
