"""A real PostgreSQL on 127.0.0.1 for tests and benchmarks: MLflow's production backend store
(infra/k8s/base/postgres.yaml), started from the machine's server programs (Debian's `postgresql`
package, which .ci/run installs where it is missing) and stopped after.

PostgreSQL refuses to run as root; run as root, the cluster belongs to the `postgres` account the
Debian package creates, in a folder of its own under the system's temporary directory (a pytest
folder is private to root). Clients log in with a password over TCP only (scram-sha-256, as the
cluster's secrets do); no Unix socket is made.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from perception.testing.mlflow_server import free_port

USER = "mlflow"
DATABASES = ("mlflow", "mlflow_auth")  # the tracking store and the basic-auth user store, as in the cluster
START_TIMEOUT_S = 60.0


def server_bin_dir() -> Path:
    """The folder holding initdb and postgres: PATH first, then Debian's versioned folders, newest first."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]), reverse=True)
    if found:
        return Path(found[0]).parent
    raise RuntimeError(
        "PostgreSQL's server programs (initdb, postgres) are neither on PATH nor under "
        "/usr/lib/postgresql/*/bin: install Debian's `postgresql` package (.ci/run does)"
    )


@dataclass
class Postgres:
    """One cluster: `start`, `stop`, `restart`; `uri(database)` for SQLAlchemy, `dsn(database)` for libpq."""

    data_dir: Path
    port: int
    password: str
    durable: bool = True  # fsync as production; off for tests, whose stores are thrown away
    log: Path = field(init=False)
    _proc: Optional[subprocess.Popen] = None

    def __post_init__(self) -> None:
        self.log = self.data_dir.parent / "postgres.log"

    def uri(self, database: str = "mlflow") -> str:
        # The driver named: SQLAlchemy 2.1's default for a bare postgresql:// is psycopg 3, not psycopg2
        return "postgresql+psycopg2" + self.dsn(database)[len("postgresql") :]

    def dsn(self, database: str = "mlflow") -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        cmd = [
            str(server_bin_dir() / "postgres"),
            "-D",
            str(self.data_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-k",
            "",
            "-c",
            f"fsync={'on' if self.durable else 'off'}",
            "-c",
            "max_connections=300",  # as the cluster's: two server workers' pools (mlflow_server.STORE_POOL)
        ]
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.data_dir, **_as_owner()
            )
        self._wait_ready()

    def stop(self, fast: bool = True) -> None:
        """Fast shutdown (SIGINT: rolls back open transactions, then exits); `fast=False` kills it, as
        a crashed pod would be, and the next start recovers from the write-ahead log."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGINT if fast else signal.SIGKILL)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, fast: bool = True) -> None:
        self.stop(fast)
        self.start()

    def pid(self) -> Optional[int]:
        return None if self._proc is None else self._proc.pid

    def _wait_ready(self) -> None:
        import psycopg2  # type: ignore[import-untyped]  # no stubs installed

        assert self._proc is not None, "_wait_ready after start"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self._proc.returncode}; its log {self.log}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            try:
                psycopg2.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg2.OperationalError:
                time.sleep(0.2)
        raise RuntimeError(
            f"postgres on port {self.port} did not accept connections within "
            f"{START_TIMEOUT_S:.0f} s; its log {self.log}"
        )


@contextmanager
def postgres(durable: bool = True) -> Iterator[Postgres]:
    """A new cluster with MLflow's two databases, on a free port; removed with its data at the end."""
    import psycopg2

    home = Path(tempfile.mkdtemp(prefix="perception-pg-"))
    try:
        data_dir = home / "data"
        pg = Postgres(data_dir, free_port(), secrets.token_hex(16), durable)
        pwfile = home / "pw"
        pwfile.write_text(pg.password + "\n")
        owner = _owner()
        if owner is not None:  # root: the cluster's files belong to the postgres account
            for path in (home, pwfile):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        subprocess.run(
            [
                str(server_bin_dir() / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                USER,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            cwd=home,
            **_as_owner(),
        )
        pwfile.unlink()
        pg.start()
        try:
            conn = psycopg2.connect(pg.dsn("postgres"))
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cur:
                for db in DATABASES:
                    cur.execute(f"CREATE DATABASE {db}")
            conn.close()
            yield pg
        finally:
            pg.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _owner() -> Optional[pwd.struct_passwd]:
    """The account the cluster runs as when this process is root; None when it runs as this user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "PostgreSQL cannot run as root and there is no `postgres` account to run it as: "
            "install Debian's `postgresql` package, which creates it (.ci/run does)"
        ) from None


def _as_owner() -> dict:
    owner = _owner()
    return {} if owner is None else {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
