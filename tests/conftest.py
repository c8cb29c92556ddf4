"""Session-wide test setup: the fixtures' folder, an isolated PERCEPTION_HOME, hypothesis profile."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # its background thread races client calls
# Scratch on tmpfs where there is one (pytest reads this root when it makes its first tmp_path): an
# MLflow sqlite store commits, and fsyncs, dozens of times while creating its tables.
if "PYTEST_DEBUG_TEMPROOT" not in os.environ and os.access("/dev/shm", os.W_OK | os.X_OK):
    os.environ["PYTEST_DEBUG_TEMPROOT"] = "/dev/shm"
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from perception.data.config import DataConfig
from perception.testing.mlflow_server import USERNAME, MlflowServer
from perception.testing.postgres_server import postgres

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # third-party samples, each with its PROVENANCE.md

settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker's torch gets its share of the cores: torch's default (every core) in each
    worker has the workers' thread pools contend for the same cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, the costliest first (`@pytest.mark.slow(seconds=...)`, a stable sort): the
    workers start on the long end-to-end runs together and the short tests fill in after them, instead
    of one worker finishing alone on a long run at the end."""

    def cost(item: pytest.Item) -> float:
        mark = item.get_closest_marker("slow")
        return -1.0 if mark is None else float(mark.kwargs.get("seconds", 30))

    items.sort(key=cost, reverse=True)


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


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store with its tables made and nothing logged: the first open of a new store
    runs ~50 schema migrations, which a test that only needs a fresh store should not pay again."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("empty-mlflow-db") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # opening the store makes the tables
    return path


@pytest.fixture
def perception_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_mlflow_db: Path) -> Path:
    """A fresh PERCEPTION_HOME per test, with no tracking URI leaking in from the environment; its
    default MLflow store (home/mlflow.db) is a copy of an empty one whose tables are made."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(empty_mlflow_db, home / "mlflow.db")
    monkeypatch.setenv("PERCEPTION_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="session")
def sqlite_mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """One real `mlflow server` on a sqlite store for the whole test session."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgresql_mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """The production backend (DESIGN §6): a real PostgreSQL started for the session, and an `mlflow server`
    on it with proxied artifacts and basic auth, as infra/k8s/base runs it; both stopped at the end."""
    import secrets

    with postgres(durable=False) as pg:  # fsync off: the store is thrown away
        server = MlflowServer(
            tmp_path_factory.mktemp("mlflow-server-pg"),
            backend_store_uri=pg.uri("mlflow"),
            auth_database_uri=pg.uri("mlflow_auth"),
            password=secrets.token_hex(12),
        )
        server.start()
        yield server
        server.stop()


@pytest.fixture
def mlflow_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real `mlflow server` on 127.0.0.1; yields its URI. sqlite unless a test parametrizes it
    indirectly with "postgresql"; then the test's process and every command it starts log in to it
    (MLFLOW_TRACKING_USERNAME/PASSWORD)."""
    backend = getattr(request, "param", "sqlite")
    server = request.getfixturevalue(f"{backend}_mlflow_server")
    if server.auth_database_uri:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USERNAME)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.password)
    return server.uri
