"""One local MLflow store for the gate tests; each test logs its own sweep (its own sweep_id)."""

from __future__ import annotations

import os

# MLflow's telemetry thread adds and removes an environment variable while requests read the
# environment: an occasional KeyError in a client call. Off before MLflow is first imported.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest  # noqa: E402

from perception.testing.sweep_store import new_store  # noqa: E402


@pytest.fixture(scope="session")
def gate_store(tmp_path_factory: pytest.TempPathFactory):
    """(tracking URI, client) of a sqlite store whose migrations run once per session."""
    return new_store(tmp_path_factory.mktemp("gate-store"))
