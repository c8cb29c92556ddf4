"""MLflow's system metrics for one training run: `system/cpu_utilization_percentage`,
`system/system_memory_usage_megabytes`, … (psutil) and `system/gpu_<i>_utilization_percentage`,
`system/gpu_<i>_memory_usage_megabytes`, … (nvidia-ml-py) where a GPU is present.

MLflow's SystemMetricsMonitor samples in a thread (every 5 s, so that a run of a minute logs 12 samples
and the gate's report has a median of at least 10 to show; MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
overrides) and logs straight to the run, not through the ledger: a sample lost in an outage is not
worth replaying. Its thread ends for good when the server fails to answer once, so `keep_alive`
starts a new one that continues the steps. Starting one sends requests (the stopped one's last batch, the
run's last step), so it happens in a thread of its own: a server that answers slowly or not at all holds
that thread, never the training. Nothing here may fail a training: errors become warnings.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

SAMPLING_INTERVAL_S = 5.0


class SystemMetrics:
    def __init__(self, run_id: str, tracking_uri: str):
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self._monitor: Optional[SystemMetricsMonitor] = None
        self._starting: Optional[threading.Thread] = None  # a (re)start in flight

    def start(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(
                self.run_id, sampling_interval=SAMPLING_INTERVAL_S, resume_logging=True, tracking_uri=self.tracking_uri
            )
            self._monitor.start()
        except Exception as exc:  # psutil missing, server down: train without them
            self._warn("could not start", exc)
            self._monitor = None

    def keep_alive(self) -> None:
        """Starts sampling, or restarts it after the monitor's thread gave up (it does on one failed
        request), in a thread of its own; returns at once. Called by the training only, as `stop` is."""
        if self._starting is not None and self._starting.is_alive():
            return
        thread = getattr(self._monitor, "_process", None)
        if self._monitor is None or thread is None or not thread.is_alive():
            self._starting = threading.Thread(target=self._restart, name="perception-system-metrics", daemon=True)
            self._starting.start()

    def _restart(self) -> None:
        self._stop(final_sample=False)
        self.start()

    def stop(self, final_sample: bool = True) -> None:
        """Ends sampling, after a (re)start in flight; with `final_sample`, logs one more sample first, so
        a run shorter than the interval (or killed early) still has its numbers."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        self._stop(final_sample)

    def _stop(self, final_sample: bool) -> None:
        m, self._monitor = self._monitor, None
        if m is None:
            return
        try:
            m.finish()
            if final_sample:
                m.collect_metrics()
                m.publish_metrics(m.aggregate_metrics())
                m.mlflow_logger.flush()
        except Exception as exc:
            self._warn("could not log the last sample of", exc)

    @staticmethod
    def _warn(what: str, exc: BaseException) -> None:
        print(f"[perception] WARNING: {what} the system metrics: {type(exc).__name__}: {exc}", file=sys.stderr)


def start_system_metrics(enabled: bool, run_id: Optional[str], tracking_uri: str) -> Optional[SystemMetrics]:
    """None when switched off (tracking.system_metrics=false) or the run is not created yet (outage)."""
    if not enabled or run_id is None:
        return None
    monitor = SystemMetrics(run_id, tracking_uri)
    monitor.keep_alive()
    return monitor
