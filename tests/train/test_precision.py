"""trainer.precision: bf16 autocasts the forward pass, the hot ops stay fp32, and the run says so."""

from __future__ import annotations

import json

import torch
from mlflow.tracking import MlflowClient

from perception.model import ModelConfig, PerceptionModel
from perception.train.precision import forward_context
from tests.train.helpers import cli


def test_bf16_autocasts_the_trunk_and_keeps_pools_scan_and_heads_fp32():
    model = PerceptionModel(ModelConfig(d_model=16, ops="ref"), n_features=4, horizons=[2, 5], seed=0)
    model.set_dt_scale(1.0)
    x, dt = torch.randn(3, 24, 4), torch.ones(3, 24)
    seen = {}

    def record(name):
        def hook(module, args, out):
            seen[name] = out.dtype

        return hook

    for name in ("mamba", "pool", "cfc"):
        getattr(model, name).register_forward_hook(record(name))
    with forward_context("bf16", torch.device("cpu")):
        logits = model(x, dt)
    assert seen == {"mamba": torch.bfloat16, "pool": torch.float32, "cfc": torch.float32}
    assert logits.dtype == torch.float32
    with forward_context("fp32", torch.device("cpu")):
        ref = model(x, dt)
    assert seen["mamba"] == torch.float32
    assert torch.allclose(logits, ref, atol=0.1) and not torch.equal(logits, ref)  # bf16 rounding, no more


def test_a_bf16_run_trains_and_logs_its_precision(perception_home):
    res = cli(
        "perception-train",
        "experiment=ci",
        "trainer.epochs=1",
        "trainer.precision=bf16",
        "sweep_id=p1",
        home=perception_home,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run = perception_home / "runs" / "p1" / "shared-f0"
    metrics = json.loads((run / "done.json").read_text())["metrics"]
    aucs = [v for k, v in metrics.items() if k.startswith("val_auc_h")]
    assert len(aucs) == 5 and all(0.0 < v < 1.0 for v in aucs)
    client = MlflowClient(f"sqlite:///{perception_home / 'mlflow.db'}")
    run_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    params = client.get_run(run_id).data.params
    assert params["trainer.precision"] == "bf16"
    # perception-train's own composition keeps the gate config the experiment chose by name, as `composed` does
    assert params["gate"] == "ci" and not any(k.startswith("gate.") for k in params)
