"""A `ci` run against a real `mlflow server` follows DESIGN §6's contract: tags, nesting, per-epoch
metrics, flattened params, predictions and attention diagnostics."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from perception.contract import AGREED_PARAMS, DIAGNOSTICS, PARAM_DEFAULTS
from perception.run_id import run_seed
from tests.train.helpers import cli

EPOCHS = 2
HORIZONS = [2, 5, 10, 20, 40]


def _runs(client: MlflowClient, sweep_id: str, role: str):
    exp = client.get_experiment_by_name("perception-ab")
    return client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = '{role}'")


def test_ci_run_logs_the_contract_to_a_server(perception_home, mlflow_server, tmp_path):
    res = cli(
        "perception-train",
        "experiment=ci",
        "sweep_id=contract",
        "model.attention_pool=per_horizon",
        "data.fold=1",
        f"trainer.epochs={EPOCHS}",
        f"tracking.uri={mlflow_server}",
        home=perception_home,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    (parent,) = _runs(client, "contract", "sweep")
    (run,) = _runs(client, "contract", "train")
    tags = run.data.tags
    assert tags["variant"] == "per_horizon" and tags["fold"] == "1" and tags["role"] == "train"
    assert tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.info.status == "FINISHED"

    params = run.data.params
    assert params["data.window"] == "32" and params["data.fold"] == "1"
    assert params["data.horizons"] == str(HORIZONS)
    assert params["model.attention_pool"] == "per_horizon"
    assert params["trainer.epochs"] == str(EPOCHS) and params["seed"] == str(run_seed(0, 1, 0))  # fold 1's own
    assert len(params["git_sha"]) >= 7 and len(params["data_hash"]) >= 8

    assert {k: tags[k] for k in ("sweep_id", "replicate")} == {"sweep_id": "contract", "replicate": "0"}
    assert set(PARAM_DEFAULTS) | set(AGREED_PARAMS) | {"seed"} <= set(params)  # what the gate reads
    for key in [f"val_auc_h{h}" for h in HORIZONS] + [
        "val_auc_mean",
        "train_loss",
        "val_loss",
        "samples_per_s",
        *DIAGNOSTICS,
    ]:
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(EPOCHS)), key
        assert all(np.isfinite(m.value) for m in history), key

    local = tmp_path / "artifacts"
    client.download_artifacts(run.info.run_id, "", str(local))
    with np.load(local / "predictions" / "val_final.npz") as f:
        n = len(f["index"])
        assert f["probs"].shape == (n, 5) and f["probs"].dtype == np.float32
        assert f["labels"].dtype == np.uint8 and f["mask"].dtype == bool and f["index"].dtype == np.int64
        assert np.all(np.diff(f["index"]) > 0)
    with np.load(local / "diagnostics" / "attention_by_lag.npz") as f:
        assert f["mass"].shape == (5, len(f["lag_edges"]) - 1)
        np.testing.assert_allclose(f["mass"].sum(axis=1), 1.0, rtol=1e-5)
        assert list(f["query_names"]) == [f"h{h}" for h in HORIZONS]
    assert (local / "diagnostics" / "attention_by_lag.png").stat().st_size > 1000


@pytest.mark.slow(seconds=30)
def test_default_store_needs_no_server(perception_home):
    res = cli("perception-train", "experiment=ci", "sweep_id=local", "trainer.epochs=1", home=perception_home)
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{perception_home / 'mlflow.db'}")
    (run,) = _runs(client, "local", "train")
    assert run.info.status == "FINISHED"
    assert (perception_home / "runs" / "local" / "shared-f0" / "done.json").exists()
    # artifacts land under PERCEPTION_HOME, never in the working directory
    assert any((perception_home / "mlartifacts").rglob("val_final.npz"))
