"""How a training run's MLflow record ends, whatever ends it: FINISHED, FAILED (it raised) or
KILLED (Ctrl-C, SIGTERM). The end goes through the run's ledger, so it reaches MLflow even when
the server is down at that moment; the run's log and config go up with it.

Run directory files uploaded at every end (artifact path in MLflow):
    train.log → logs/     config.yaml, overrides.yaml → config/
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from omegaconf import OmegaConf

from perception.atomic import atomic_write_text
from perception.tracking import BackgroundSender, RunLedger
from perception.train.runlog import LOG_FILE
from perception.train.sysmetrics import SystemMetrics, start_system_metrics

CONFIG_FILE, OVERRIDES_FILE = "config.yaml", "overrides.yaml"
FILES = ((LOG_FILE, "logs"), (CONFIG_FILE, "config"), (OVERRIDES_FILE, "config"))


def write_config(run_dir: Path, cfg, overrides: Sequence[str]) -> None:
    """The config the run resolved to (arm and replicate seed applied) and the overrides it was given."""
    atomic_write_text(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    atomic_write_text(run_dir / OVERRIDES_FILE, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Holds back SIGTERM's handler for the block, then runs it once if a SIGTERM came meanwhile."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    came: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: came.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if came and callable(previous):
            previous(*came[0])


@dataclass
class RunRecord:
    ledger: RunLedger
    system_metrics: bool  # tracking.system_metrics
    # a standalone training (no tracking.parent_run_id, no sweep runner): it settles its parent's status
    # each time its own changes (tracking.settle_parent), so the parent never claims to run after it ended
    settles_parent: bool = False
    monitor: Optional[SystemMetrics] = None
    sender: Optional[BackgroundSender] = None  # while the epochs run: sends beside the training

    def send_in_background(self) -> None:
        """From here until the end the ledger is sent on a thread of its own: a slow server holds no step."""
        if self.sender is None:
            self.sender = BackgroundSender(self.ledger)

    def send_soon(self, force: bool = False) -> None:
        """What the ledger holds unsent goes out beside the training (at once where no sender runs)."""
        if self.sender is None:
            self.ledger.flush(force=force)
        else:
            self.sender.soon(force)

    def status_changed(self) -> None:
        """After the run's start, resume or end is recorded: its parent follows, through the ledger (an
        outage delays it, in order, until the run's own operations are sent)."""
        if self.settles_parent:
            self.ledger.record("settle_parent")

    def monitoring(self) -> None:
        """Starts the system metrics once the MLflow run exists; restarts them if they stopped."""
        if self.monitor is None:
            self.monitor = start_system_metrics(self.system_metrics, self.ledger.run_id(), self.ledger.tracking_uri)
        else:
            self.monitor.keep_alive()

    def end(self, status: str) -> bool:
        """Stops the system metrics, records the files and the end; True when all of it was sent.
        A SIGTERM meanwhile waits until the end is recorded: cut short, the run would stay RUNNING."""
        with sigterm_deferred():
            return self._end(status)

    def _end(self, status: str) -> bool:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self.sender is not None:  # the final flush below waits for a send in flight
            self.sender.close()
            self.sender = None
        if not self.ledger.started():  # failed before its MLflow run was recorded: nothing to end
            return True
        for rel, artifact_path in FILES:
            if (self.ledger.run_dir / rel).exists():
                self.ledger.record("artifact", path=rel, artifact_path=artifact_path)
        self.ledger.record("end", status=status)
        self.status_changed()
        return self.ledger.flush(force=True)
