"""MLflow's own messages kept off the terminal: its INFO lines (store migrations, the system-metrics
monitor starting and stopping) go into a log file, its warnings and errors still reach the terminal,
and its artifact-download bars are off. A terminal then shows the product's progress lines."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator, TextIO

MLFLOW_LOGGERS = ("mlflow",)  # alembic's and sqlalchemy's are at WARNING already (MLflow sets them so)
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def no_artifact_bars() -> None:
    """No MLflow download/upload bars in this process or the commands it starts (unless the user set it)."""
    os.environ.setdefault(PROGRESS_BAR_ENV, "false")


def _below_warning(record: logging.LogRecord) -> bool:
    return record.levelno < logging.WARNING


def _warning_or_worse(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


@contextmanager
def mlflow_info_into(stream: TextIO) -> Iterator[None]:
    """While inside: MLflow's records below WARNING are written to `stream` only; the handlers MLflow
    installed (to the terminal) keep the warnings and errors. Restored on exit."""
    import mlflow  # noqa: F401  (MLflow installs its handlers on import: filter those, not none)

    file_handler = logging.StreamHandler(stream)
    file_handler.setFormatter(logging.Formatter(FORMAT))
    file_handler.addFilter(_below_warning)
    loggers = [logging.getLogger(name) for name in MLFLOW_LOGGERS]
    terminal = [(lg, h) for lg in loggers for h in lg.handlers]
    for lg, h in terminal:
        h.addFilter(_warning_or_worse)
    for lg in loggers:
        lg.addHandler(file_handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(file_handler)
        for lg, h in terminal:
            h.removeFilter(_warning_or_worse)
