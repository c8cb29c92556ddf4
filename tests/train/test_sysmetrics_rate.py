"""At its default period the system-metrics monitor logs at least 10 samples in 55 s, so a run of a
minute or more gives the gate's report a median of at least 10 (it needs 10, tests/sweep/test_parent_run.py)."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

from perception.gate.report import MIN_GPU_SAMPLES
from perception.train.sysmetrics import SAMPLING_INTERVAL_S, start_system_metrics


@pytest.mark.slow(seconds=60)  # waiting, not computing
def test_the_default_period_logs_ten_samples_in_55_seconds(mlflow_server, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", raising=False)
    client = MlflowClient(mlflow_server)
    run = client.create_run(client.create_experiment(f"sysmetrics-{time.time_ns()}"))
    monitor = start_system_metrics(True, run.info.run_id, mlflow_server)
    time.sleep(55.0)
    monitor.stop(final_sample=False)
    samples = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(samples) >= MIN_GPU_SAMPLES, (len(samples), SAMPLING_INTERVAL_S)
