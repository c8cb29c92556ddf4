"""A real `mlflow server` on 127.0.0.1 for tests and benchmarks (DESIGN §6 "Testing on 2 cores").

By default: sqlite backend, artifacts proxied by the server (--serve-artifacts) into a local folder,
one worker, job execution off (it would spawn extra processes), started in its own process group so
the whole group (server + its workers) is killed at the end. Given a PostgreSQL URI it runs as the
cluster runs it (infra/k8s/base/mlflow.yaml): that backend, and with `auth_database_uri` the basic-auth
app whose admin is `USERNAME` (clients send MLFLOW_TRACKING_USERNAME/PASSWORD).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from perception.sweep.ui import stop, wait_healthy  # the same start and stop as `perception-sweep ui`

USERNAME = "perception"

# The tracking store's connection pool, as the cluster sets it (infra/k8s/base/mlflow.yaml). MLflow's
# log_batch holds a connection while it takes a second for the params, metrics and tags; a worker runs up
# to 40 requests at once (anyio's threads), so a pool smaller than twice that can be held entirely by
# first connections, each request waiting for a second that never frees (docs/performance.md).
STORE_POOL = {"MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": "40", "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": "45"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MlflowServer:
    """A server that can be stopped and started again on the same port and stores (fault tests)."""

    root: Path
    backend_store_uri: Optional[str] = None  # None: sqlite under root
    auth_database_uri: Optional[str] = None  # the basic-auth user store; None: no auth
    password: str = ""
    workers: int = 1
    auth_cache_s: int = 60  # the auth app's credential cache, as the cluster's (0: each request re-hashes)
    store_pool: Optional[dict[str, str]] = None  # a PostgreSQL store's pool settings; None: STORE_POOL

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = self.root / "server.log"
        self._proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--backend-store-uri",
            self.backend_store_uri or f"sqlite:///{self.root / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.root / "artifacts"),
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        if self.backend_store_uri and self.backend_store_uri.startswith("postgresql"):
            env.update(STORE_POOL if self.store_pool is None else self.store_pool)
        if self.auth_database_uri:
            cmd += ["--app-name", "basic-auth"]
            ini = self.root / "basic_auth.ini"
            ini.write_text(
                "[mlflow]\ndefault_permission = READ\n"
                f"database_uri = {self.auth_database_uri}\nadmin_username = {USERNAME}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                f"auth_cache_ttl_seconds = {self.auth_cache_s}\n"
            )
            env.update(
                MLFLOW_AUTH_CONFIG_PATH=str(ini),
                MLFLOW_AUTH_ADMIN_PASSWORD=self.password,
                MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(32),
            )  # CSRF key, one per start as in the pod
        with open(self.log, "ab") as log_f:
            self._proc = subprocess.Popen(
                cmd, stdout=log_f, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True
            )
        wait_healthy(self.uri, self._proc, self.log)

    def stop(self) -> None:
        if self._proc is not None:
            stop(self._proc)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL to the whole group, as a node failure would: no request is finished."""
        import signal

        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)
        self._proc = None

    def pid(self) -> Optional[int]:
        return None if self._proc is None else self._proc.pid


@contextmanager
def mlflow_server(root: Path, **kwargs) -> Iterator[str]:
    """Starts a server storing everything under `root` (see MlflowServer); yields its URI."""
    server = MlflowServer(root, **kwargs)
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()
