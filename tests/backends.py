"""The end-to-end tests that matter run against both tracking stores (tests/conftest.py's `mlflow_server`,
whose servers are perception/testing/mlflow_server.py's)."""

from __future__ import annotations

from typing import Optional

import pytest


def both_backends(postgresql_seconds: Optional[int] = None):
    """sqlite and PostgreSQL; the PostgreSQL run, with auth, marked slow at its measured cost where it has one."""
    pg = (
        "postgresql"
        if postgresql_seconds is None
        else pytest.param("postgresql", marks=pytest.mark.slow(seconds=postgresql_seconds))
    )
    return pytest.mark.parametrize("mlflow_server", ["sqlite", pg], indirect=True)
