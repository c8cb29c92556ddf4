"""Which Argo server the sweep commands talk to and how, read the argo CLI's way: each option, else
its environment variable, else the default.

    --host URL or host:port    ARGO_SERVER (host:port, as the argo CLI takes it; a scheme is accepted)
    --namespace NS             ARGO_NAMESPACE, else perception
    --secure=false             ARGO_SECURE (default true: https; false: plain http, asked for explicitly)
    -k, --insecure             ARGO_INSECURE_SKIP_VERIFY (https without checking the certificate)
                               ARGO_BASE_HREF: the path of a server behind an ingress (/argo)
    the token                  ARGO_TOKEN only ("Bearer …" as the argo CLI takes it, or the bare token)

Plain http sends the bearer token in clear, so an http:// host is refused unless plain http was asked
for; skipping certificate verification (`--insecure`) is a separate choice that still uses TLS."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlparse

from perception.errors import ConfigError

DEFAULT_NAMESPACE = "perception"
SERVER_ENV, SECURE_ENV, SKIP_VERIFY_ENV = "ARGO_SERVER", "ARGO_SECURE", "ARGO_INSECURE_SKIP_VERIFY"
NAMESPACE_ENV, BASE_HREF_ENV = "ARGO_NAMESPACE", "ARGO_BASE_HREF"
# Go's strconv.ParseBool, which the argo CLI reads these variables with
TRUE, FALSE = {"1", "t", "T", "TRUE", "true", "True"}, {"0", "f", "F", "FALSE", "false", "False"}


@dataclass(frozen=True)
class ArgoTarget:
    host: str  # the server's URL with a trailing slash: hera joins API paths onto it
    namespace: str
    verify_tls: bool
    plain_http: bool  # asked for with --secure=false / ARGO_SECURE=false


def parse_bool(value: str, where: str) -> bool:
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false (or 1/0, t/f), got {value!r}")


def resolve(
    host: Optional[str] = None,
    namespace: Optional[str] = None,
    secure: Optional[str] = None,
    insecure: bool = False,
    env: Mapping[str, str] = os.environ,
) -> Optional[ArgoTarget]:
    """The server from the options and the environment; None when neither names one."""
    where, host = (
        (f"--host {host!r}", host)
        if host
        else (f"{SERVER_ENV}={env.get(SERVER_ENV)!r}", env.get(SERVER_ENV, "").strip())
    )
    if not host:
        return None
    if secure is not None:
        secure_where, secure_value = f"--secure={secure}", parse_bool(secure, f"--secure={secure}")
    elif env.get(SECURE_ENV, "").strip():
        secure_where = f"{SECURE_ENV}={env[SECURE_ENV].strip()}"
        secure_value = parse_bool(env[SECURE_ENV].strip(), secure_where)
    else:
        secure_where, secure_value = "", True
    skip_verify = insecure or (
        bool(env.get(SKIP_VERIFY_ENV, "").strip())
        and parse_bool(env[SKIP_VERIFY_ENV].strip(), f"{SKIP_VERIFY_ENV}={env[SKIP_VERIFY_ENV]}")
    )
    url = _url(host, where, secure_value, secure_where, env.get(BASE_HREF_ENV, ""))
    return ArgoTarget(
        host=url,
        namespace=namespace or env.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE,
        verify_tls=not skip_verify,
        plain_http=url.startswith("http://"),
    )


def _url(host: str, where: str, secure: bool, secure_where: str, base_href: str) -> str:
    if "://" not in host:  # host:port, the argo CLI's form: the scheme follows --secure
        host = ("https://" if secure else "http://") + host
    parsed = urlparse(host)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"{where}: expected the Argo server as host:port (e.g. argo.example.com:2746) or "
            f"its URL (e.g. https://argo.example.com)"
        )
    if parsed.scheme == "http" and secure and not secure_where:
        raise ConfigError(
            f"{where}: plain http would send the bearer token (ARGO_TOKEN) unencrypted; use "
            f"https://, or ask for plain http with --secure=false (or {SECURE_ENV}=false)"
        )
    if parsed.scheme == "http" and secure:
        raise ConfigError(f"{where} is plain http but {secure_where} asks for TLS: use https:// or host:port")
    if parsed.scheme == "https" and not secure:
        raise ConfigError(f"{where} is https but {secure_where} asks for plain http: drop one of them")
    if base_href.strip("/") and parsed.path.strip("/") == "":
        host = host.rstrip("/") + "/" + base_href.strip("/")
    return host if host.endswith("/") else host + "/"
