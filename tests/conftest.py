"""Session-wide test setup: the fixtures' folder, an isolated PERCEPTION_HOME, hypothesis profile."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # its background thread races client calls
from pathlib import Path

import pytest
from hypothesis import settings

from perception.data.config import DataConfig
from tests.mlflow_server import mlflow_server as _start_mlflow_server

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # third-party samples, each with its PROVENANCE.md

settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort): the workers start on the long end-to-end runs together, and the
    short tests fill in after them, instead of one worker finishing alone on a long run at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# A small synthetic book for loader, prefetch and validation tests: 3000 snapshots, windows of 16
SMALL_BOOK = DataConfig(n_snapshots=3000, window=16, window_stride=3, horizons=[2, 10, 30])


@pytest.fixture(scope="session")
def small_book(tmp_path_factory):
    """(dataset, purged split, normaliser fitted on the training windows) of SMALL_BOOK; read only."""
    from perception.data import Normalizer, load_dataset, purged_split

    ds = load_dataset(SMALL_BOOK, home=tmp_path_factory.mktemp("small-book"), progress=False)
    split = purged_split(ds, SMALL_BOOK)
    return ds, split, Normalizer.fit(ds, split.train_ends, SMALL_BOOK.window)


@pytest.fixture(scope="session")
def databento_dir() -> Path:
    """Databento's own MBP-10 test files and their renderings (tests/fixtures/databento)."""
    return FIXTURES / "databento"


@pytest.fixture
def perception_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh PERCEPTION_HOME per test, with no tracking URI leaking in from the environment."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PERCEPTION_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """One real `mlflow server` on 127.0.0.1 for the whole test session; yields its URI."""
    with _start_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri
