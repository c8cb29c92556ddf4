"""The Argo server, as the sweep commands use it: hera's WorkflowsService for workflows (get, list,
stop, create) and plain requests for the pods' logs, whose newline-delimited JSON stream hera 7.1's
`workflow_logs` cannot parse.

Every call has a timeout (hera's own session has none, and a wait of three days must not hang on one
dead connection). Errors become ArgoError, which says whether a retry can help; a response body in
its message has the token and any credential-like field removed first (perception.sweep.redact).
Where the server is and how to reach it: perception.sweep.argo_options."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional
import requests

from perception.errors import ConfigError, PerceptionError
from perception.sweep.argo_options import ArgoTarget
from perception.sweep.redact import redact

TOKEN_ENV = "ARGO_TOKEN"
REQUEST_TIMEOUT_S = 30.0  # connect and read, per call; a followed log stream reads without a limit


def token_from_env(env: Mapping[str, str] = os.environ) -> str:
    """The bearer token, from ARGO_TOKEN only: an argument would land in shell history and `ps`."""
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(
            f'{TOKEN_ENV} is not set: export the Argo server\'s bearer token (e.g. ARGO_TOKEN="$(argo auth token)")'
        )
    return token


class _Refused(Exception):
    """A non-2xx answer, raised by the session before hera formats it (hera puts the body in its message)."""

    def __init__(self, status: int, text: str):
        super().__init__(status)
        self.status, self.text = status, text


class ArgoError(PerceptionError):
    """A failed call. `transient`: a later call may succeed (connection, 5xx); `status`: HTTP status."""

    def __init__(self, message: str, status: Optional[int] = None, transient: bool = False):
        super().__init__(message)
        self.status, self.transient = status, transient


@dataclass(frozen=True)
class LogLine:
    pod: str
    content: str


class _Session(requests.Session):
    """Every call with a timeout; an error answer raised as _Refused with its body (streams too)."""

    def request(self, method, url, **kwargs):  # noqa: D102 (requests' signature)
        kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
        resp = super().request(method, url, **kwargs)
        if not resp.ok:
            with resp:
                raise _Refused(resp.status_code, resp.text)
        return resp


class ArgoServer:
    """One Argo server and namespace; the token comes from ARGO_TOKEN unless given."""

    def __init__(self, target: ArgoTarget, token: Optional[str] = None):
        from hera.workflows import WorkflowsService

        self.target, self.host, self.namespace = target, target.host, target.namespace
        self.token = token or token_from_env()
        self.service = WorkflowsService(
            host=self.host, token=self.token, namespace=self.namespace, verify_ssl=target.verify_tls, session=_Session()
        )

    def link(self, name: str) -> str:
        """The workflow's page in the Argo UI."""
        return f"{self.host}workflows/{self.namespace}/{name}"

    def create(self, workflow) -> str:
        """Posts a built hera Workflow; returns the name the server gave it."""
        from hera.workflows.models import WorkflowCreateRequest

        created = self._call(
            "submitting",
            lambda: self.service.create_workflow(WorkflowCreateRequest(workflow=workflow), namespace=self.namespace),
            "",
        )
        return created.metadata.name

    def get(self, name: str):
        """The workflow (hera model: .metadata, .spec, .status.nodes…)."""
        return self._call("reading", lambda: self.service.get_workflow(name, namespace=self.namespace), name)

    def list(self, label_selector: Optional[str] = None) -> list:
        found = self._call(
            "listing", lambda: self.service.list_workflows(namespace=self.namespace, label_selector=label_selector), ""
        )
        return list(found.items or [])

    def stop(self, name: str, message: str = "") -> None:
        """Argo's stop: running pods end, exit handlers still run (unlike terminate)."""
        from hera.workflows.models import WorkflowStopRequest

        req = WorkflowStopRequest(name=name, namespace=self.namespace, message=message or None)
        self._call("stopping", lambda: self.service.stop_workflow(name, req, namespace=self.namespace), name)

    def logs(self, name: str, pod: Optional[str] = None, follow: bool = False) -> Iterator[LogLine]:
        """The main containers' log lines of a workflow (one pod's with `pod`), as the server streams
        them: one JSON object per line, {"result": {"content": "...", "podName": "..."}}."""
        params = {"logOptions.container": "main"}
        if pod:
            params["podName"] = pod
        if follow:
            params["logOptions.follow"] = "true"
        url = f"{self.host}api/v1/workflows/{self.namespace}/{name}/log"
        what = f"reading the logs of {name}" + (f" (pod {pod})" if pod else "")
        token = self.service.token
        assert token is not None  # the service was given one (__init__)
        try:
            resp = self.service.session.get(
                url,
                params=params,
                headers={"Authorization": token},
                verify=self.service.verify_ssl,
                stream=True,
                timeout=(REQUEST_TIMEOUT_S, None if follow else REQUEST_TIMEOUT_S),
            )
        except _Refused as exc:
            raise _http_error(what, url, exc.status, self._clean(exc.text)) from None
        except requests.RequestException as exc:
            raise ArgoError(
                f"{what} at {url} failed: {type(exc).__name__}: {self._clean(str(exc))}", transient=True
            ) from exc
        with resp:
            for raw in resp.iter_lines(decode_unicode=True):
                if raw:
                    yield _log_line(raw, url, self._clean)

    def _call(self, what: str, fn, name: str):
        from hera.exceptions import HeraException

        where = f"{self.host}api/v1/workflows/{self.namespace}" + (f"/{name}" if name else "")
        try:
            return fn()
        except _Refused as exc:  # `from None`: the traceback would repeat the body unredacted
            raise _http_error(f"{what} {name or 'workflows'}", where, exc.status, self._clean(exc.text)) from None
        except HeraException as exc:
            status = getattr(exc, "status_code", None)
            raise _http_error(f"{what} {name or 'workflows'}", where, status, self._clean(str(exc))) from None
        except requests.RequestException as exc:
            raise ArgoError(
                f"{what} {name or 'workflows'} at {where} failed: {type(exc).__name__}: {self._clean(str(exc))}",
                transient=True,
            ) from None

    def _clean(self, text: str) -> str:
        return redact(text, [self.token, self.service.token or ""])


def _http_error(what: str, where: str, status: Optional[int], text: str) -> ArgoError:
    hint = {
        401: " (is ARGO_TOKEN current? `argo auth token`)",
        403: " (the token's account lacks this right)",
        404: " (check the name and --namespace)",
    }.get(status or 0, "")
    transient = status is None or status >= 500 or status == 429
    return ArgoError(f"{what} at {where} failed with HTTP {status}{hint}: {text.strip()[:300]}", status, transient)


def _log_line(raw: str | bytes, url: str, clean) -> LogLine:  # bytes where the answer names no charset
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        raise ArgoError(f"{url} answered a line that is not JSON: {clean(raw)[:200]!r}") from None
    if obj.get("error"):  # a stream ends with {"error": {...}} when the server gives up mid-way
        raise ArgoError(f"{url} reported: {clean(str(obj['error'].get('message', obj['error'])))}", transient=True)
    result = obj.get("result") or {}
    return LogLine(result.get("podName", ""), result.get("content", ""))
