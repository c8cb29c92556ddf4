"""A real `mlflow server` on 127.0.0.1 for tests (DESIGN §6 "Testing on 2 cores").

One server per test session: sqlite backend, artifacts proxied by the server into a local folder,
one worker, job execution off (it would spawn extra processes), started in its own process group so
the whole group (server + its workers) is killed at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from perception.sweep.ui import stop, wait_healthy  # the same start and stop as `perception-sweep ui`


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """Starts a server storing everything under `root`; yields its URI (http://127.0.0.1:PORT)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log, "wb") as log_f:
        proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, env=env, cwd=root,
                                start_new_session=True)
    try:
        wait_healthy(uri, proc, log)
        yield uri
    finally:
        stop(proc)
