"""model.compile_trunk: the VSN and Mamba2 blocks compiled with static shapes give the eager model's
outputs and gradients, without graph breaks, under the same parameter names (checkpoints load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.mamba2 import causal_conv, causal_conv_shifted
from perception.model.vsn import grouped_linear, grouped_linear_block_diag

ROOT = Path(__file__).resolve().parents[2]


def _model(compiled: bool) -> PerceptionModel:
    cfg = ModelConfig(
        d_model=16, ops="ref", compile_trunk=compiled, mamba=MambaConfig(n_layers=1, d_state=8, headdim=8, chunk=16)
    )
    model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0)
    model.set_dt_scale(1.0)
    return model


def test_the_compiled_forms_equal_the_eager_forms():
    """What compile_trunk traces instead of eager's einsum and conv1d computes the same function, here in fp64."""
    g = torch.Generator().manual_seed(0)
    a, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 7, 5, 8), (5, 16, 8), (5, 16)))
    torch.testing.assert_close(grouped_linear_block_diag(a, w, b), grouped_linear(a, w, b), rtol=1e-12, atol=1e-12)
    conv = torch.nn.Conv1d(6, 6, 4, groups=6, padding=3).double()
    xbc = torch.randn(2, 9, 6, generator=g, dtype=torch.float64)
    assert causal_conv_shifted(xbc, conv).shape == (2, 9, 6)
    torch.testing.assert_close(causal_conv_shifted(xbc, conv), causal_conv(xbc, conv), rtol=1e-12, atol=1e-12)
    # causal: the output at t reads nothing after t
    later = xbc.clone()
    later[:, 5:] += 1.0
    torch.testing.assert_close(causal_conv_shifted(later, conv)[:, :5], causal_conv_shifted(xbc, conv)[:, :5])


@pytest.mark.slow(seconds=10)
def test_the_compiled_trunk_matches_eager_without_graph_breaks():
    x, dt = torch.randn(3, 32, 6, generator=torch.Generator().manual_seed(1)), torch.ones(3, 32)
    counters.clear()
    runs = {}
    for compiled in (False, True):
        model = _model(compiled)
        logits = model(x, dt)
        logits.sum().backward()
        runs[compiled] = (
            logits.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            list(model.state_dict()),
        )
    (eager, eager_grads, eager_names), (comp, comp_grads, comp_names) = runs[False], runs[True]
    assert comp_names == eager_names
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-6)
    assert eager_grads.keys() == comp_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(comp_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("chunk", [64, 128])
def test_the_compiled_trunk_matches_eager_at_production_size_on_cuda(chunk, tmp_path):
    """Production widths and K (B small): each module of a compile_trunk model against its eager twin, in
    training (output, input and parameter gradients) and in evaluation, fp32 without TF32, as the benchmark
    benchmarks/compile_check.py measures it (run as a command, in its own process)."""
    out = tmp_path / "compile_check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compile_check.py"),
            "--ways",
            "model",
            "--batch",
            "4",
            "--window",
            "6000",
            "--features",
            "65",
            "--chunk",
            str(chunk),
            "--modules",
            "vsn,mamba0",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    errors = result["errors"]["model"]
    report = [
        f"{module} {what}: max rel error {e:.2e}" for module, found in errors.items() for what, e in found.items()
    ]
    print("\n".join(report))
    assert set(errors) == {"vsn", "mamba0"} and len(report) > 6  # outputs and gradients of both modules compared
    assert all(e < result["tolerance"] for found in errors.values() for e in found.values()), "\n".join(report)
    assert result["matches_eager"] == {"model": True}
