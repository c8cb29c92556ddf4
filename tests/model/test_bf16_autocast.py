"""Under bf16 autocast (trainer.precision=bf16) the trunk's RMSNorms run in their weight's dtype: the
model trains without ATen's mixed-dtype warning, and the norm computes what RMSNorm is."""

from __future__ import annotations

import warnings

import torch

from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.mamba2 import rms_norm


def test_rms_norm_is_rmsnorm_in_the_weight_dtype_and_returns_the_input_dtype():
    g = torch.Generator().manual_seed(0)
    x, w = (
        torch.randn(3, 7, 16, generator=g, dtype=torch.float64),
        torch.rand(16, generator=g, dtype=torch.float64) + 0.5,
    )
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-5), expected, rtol=1e-12, atol=1e-12)
    low = rms_norm(x.to(torch.bfloat16), w.float(), 1e-5)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), expected, rtol=2e-2, atol=2e-2)  # bf16 input and output rounding


def test_a_bf16_autocast_step_raises_no_dtype_warning():
    cfg = ModelConfig(d_model=16, ops="ref", mamba=MambaConfig(n_layers=2, d_state=8, headdim=8, chunk=16))
    model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0)
    model.set_dt_scale(1.0)
    x, dt = torch.randn(2, 32, 6, generator=torch.Generator().manual_seed(1)), torch.ones(2, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x, dt)
        logits.float().sum().backward()
    assert logits.dtype == torch.float32  # the heads run in fp32
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.mamba.parameters())
    mismatched = [str(w.message) for w in caught if "dtype" in str(w.message).lower()]
    assert not mismatched, mismatched
