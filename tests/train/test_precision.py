"""trainer.precision: bf16 autocasts the forward pass, the hot ops stay fp32, and the run says so."""

from __future__ import annotations

import json

import torch
from mlflow.tracking import MlflowClient

from perception.model import ModelConfig, PerceptionModel
from perception.ops import cfc_scan
from perception.train.precision import forward_context
from tests.train.helpers import cli


def test_bf16_autocasts_the_forward_and_keeps_the_hot_ops_fp32():
    model = PerceptionModel(ModelConfig(d_model=16, ops="ref"), n_features=4, horizons=[2, 5], seed=0)
    model.set_dt_scale(1.0)
    x, dt = torch.randn(3, 24, 4), torch.ones(3, 24)
    seen = {}

    def record(name):
        def hook(module, args, out):
            seen[name] = out.dtype
        return hook

    for name in ("mamba", "cfc"):
        getattr(model, name).register_forward_hook(record(name))
    with forward_context("bf16", torch.device("cpu")):
        logits = model(x, dt)
    assert seen == {"mamba": torch.bfloat16, "cfc": torch.float32}  # the trunk's matmuls in bf16, the scan in fp32
    with forward_context("fp32", torch.device("cpu")):
        ref = model(x, dt)
    assert ref.dtype == torch.float32
    assert torch.allclose(logits.float(), ref, atol=0.1) and not torch.equal(logits.float(), ref)
    with forward_context("bf16", torch.device("cpu")):  # an op under autocast takes bf16 inputs, returns fp32
        h = cfc_scan(torch.randn(2, 8, 16, dtype=torch.bfloat16), torch.ones(2, 8), torch.zeros(2, 16),
                     torch.randn(16, 16), torch.randn(64, 16), torch.zeros(64), backend="ref")
    assert h.dtype == torch.float32


def test_a_bf16_run_trains_and_logs_its_precision(perception_home):
    res = cli("perception-train", "experiment=ci", "trainer.epochs=1", "trainer.precision=bf16", "sweep_id=p1",
              home=perception_home)
    assert res.returncode == 0, res.stderr[-3000:]
    run = perception_home / "runs" / "p1" / "shared-f0"
    metrics = json.loads((run / "done.json").read_text())["metrics"]
    aucs = [v for k, v in metrics.items() if k.startswith("val_auc_h")]
    assert len(aucs) == 5 and all(0.0 < v < 1.0 for v in aucs)
    client = MlflowClient(f"sqlite:///{perception_home / 'mlflow.db'}")
    run_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    assert client.get_run(run_id).data.params["trainer.precision"] == "bf16"
