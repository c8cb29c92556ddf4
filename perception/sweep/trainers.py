"""The trainings a local sweep has running, so that an interrupted sweep ends them the way a pod's end
does: SIGTERM, then a wait while each records its MLflow run KILLED. (subprocess.run would SIGKILL a
child 0.25 s after Ctrl-C, mid-record, and a SIGTERM to the sweep alone would leave them training.)"""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import IO, Optional

STOP_GRACE_S = 120.0  # a trainer's end uploads its log and sends its ledger: give it time


class Trainers:
    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._guard = threading.Lock()

    def run(self, args: list[str], env: dict[str, str], log: Optional[IO[bytes]] = None) -> tuple[int, int]:
        """Runs one training to its end; returns (exit code, pid). Interrupted here (the sequential
        sweep waits in the main thread), it stops that training before passing the interrupt on."""
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
        with self._guard:
            self._running.add(proc)
        try:
            return proc.wait(), proc.pid
        except BaseException:
            self.stop()
            raise
        finally:
            with self._guard:
                self._running.discard(proc)

    def stop(self) -> None:
        """SIGTERM to every running training, then waits for each (SIGKILL after STOP_GRACE_S)."""
        with self._guard:
            running = [p for p in self._running if p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
