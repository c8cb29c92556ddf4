"""Submits the A/B workflow to an Argo server through hera's WorkflowsService.

The bearer token comes from ARGO_TOKEN only: a command-line argument would land in shell history
and in `ps` output."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlparse

from perception.errors import ConfigError, PerceptionError
from perception.sweep.render import build

TOKEN_ENV = "ARGO_TOKEN"


@dataclass
class Submitted:
    name: str
    namespace: str
    link: str


def argo_host(host: str) -> str:
    """An http(s) URL with a trailing slash: hera joins API paths onto it, and a host with a path
    prefix (https://example.com/argo/) loses that prefix without the slash."""
    parsed = urlparse(host)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--host {host!r}: expected the Argo server's URL, e.g. https://argo.example.com")
    return host if host.endswith("/") else host + "/"


def token_from_env(env: Mapping[str, str] = os.environ) -> str:
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(f"{TOKEN_ENV} is not set: export the Argo server's bearer token "
                          f"(e.g. ARGO_TOKEN=\"$(argo auth token)\")")
    return token


def submit(host: str, namespace: str, smoke: bool = False, params: Optional[Mapping[str, str]] = None,
           token: Optional[str] = None, verify_ssl: bool = True) -> Submitted:
    from hera.workflows import WorkflowsService
    from hera.workflows.models import WorkflowCreateRequest

    host = argo_host(host)
    token = token or token_from_env()
    w = build(smoke, params)
    w.namespace = namespace
    service = WorkflowsService(host=host, token=token, namespace=namespace, verify_ssl=verify_ssl)
    try:
        created = service.create_workflow(WorkflowCreateRequest(workflow=w.build()), namespace=namespace)
    except Exception as exc:  # hera raises per-status exceptions; requests raises on connection errors
        raise PerceptionError(f"submitting to {host}api/v1/workflows/{namespace} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    name = created.metadata.name
    return Submitted(name, namespace, f"{host}workflows/{namespace}/{name}")
