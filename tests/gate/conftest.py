"""One local MLflow store for the gate tests; each test logs its own sweep (its own sweep_id)."""

from __future__ import annotations

import pytest

from tests.gate.sweep_store import new_store


@pytest.fixture(scope="session")
def gate_store(tmp_path_factory: pytest.TempPathFactory):
    """(tracking URI, client) of a sqlite store whose migrations run once per session."""
    return new_store(tmp_path_factory.mktemp("gate-store"))
