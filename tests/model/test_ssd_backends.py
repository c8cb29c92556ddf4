"""The library SSD backends (model.mamba.ssd=fla|mamba) against the project's own forms, one test each for
both: the scan against the recurrence `ssd_scan_sequential` (fp64), gradients against the chunked reference,
a compiled Mamba2 block without graph breaks, and the model under bf16 autocast. Each backend's own errors,
fakes and determinism are in test_ssd_fla.py and test_ssd_mamba.py."""

from __future__ import annotations

import pytest
import torch

from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.mamba2 import Mamba2Block, ssd_scan, ssd_scan_sequential
from perception.model.ssd_fla import fla_refusal, ssd_scan_fla
from perception.model.ssd_mamba import mamba_refusal, ssd_scan_mamba

# backend -> (the scan in ssd_scan's contract, why it cannot run here or None)
BACKENDS = {
    "fla": (ssd_scan_fla, fla_refusal),
    "mamba": (lambda *a: ssd_scan_mamba(*a, chunk=64), mamba_refusal),
}


def ssd_inputs(b=2, k=200, h=4, p=16, n=32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, k, h, p, generator=g, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(b, k, h, generator=g, dtype=torch.float64) - 2)
    A = -torch.rand(h, generator=g, dtype=torch.float64) * 8 - 0.5
    B, C = (
        torch.randn(b, k, n, generator=g, dtype=torch.float64),
        torch.randn(b, k, n, generator=g, dtype=torch.float64),
    )
    D = torch.randn(h, generator=g, dtype=torch.float64)
    return [t.to(device) for t in (x, dt, A, B, C, D)]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """A backend that can run on this machine's GPU (skipped with its refusal where it cannot)."""
    refusal = BACKENDS[request.param][1]()
    if refusal is not None:
        pytest.skip(refusal)
    return request.param


@pytest.mark.parametrize("k", [200, 256, 1000])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_scan_equals_the_recurrence(backend, k):
    inputs = ssd_inputs(k=k, device="cuda")
    want = ssd_scan_sequential(*inputs)  # fp64
    got = BACKENDS[backend][0](*[t.float() for t in inputs])
    # the libraries' dots on fp32 inputs run in TF32 (Triton's default): about 1e-3 relative
    assert (got.double() - want).abs().max() / want.abs().max() < 5e-3


@pytest.mark.parametrize("k", [200, 1000])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_scan_gradients_equal_the_chunked_ones(backend, k):
    inputs = ssd_inputs(k=k, device="cuda")
    leaves32 = [t.float().requires_grad_() for t in inputs]
    leaves64 = [t.clone().requires_grad_() for t in inputs]
    grad = torch.randn(inputs[0].shape, dtype=torch.float64, device="cuda")
    ssd_scan(*leaves64, chunk=64).backward(grad)
    BACKENDS[backend][0](*leaves32).backward(grad.float())
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D"), leaves32, leaves64):
        scale = b.grad.abs().max().item()
        err = (a.grad.double() - b.grad).abs().max().item()
        assert err <= 1e-2 * scale, f"d{name}: max error {err:.3g} against max |grad| {scale:.3g}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_block_matches_eager_without_graph_breaks(backend):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    kwargs = dict(d_state=32, headdim=16, expand=2, d_conv=4, chunk=64, ssd=backend)
    eager = Mamba2Block(64, **kwargs).cuda()
    eager.mixer.reset_parameters(torch.Generator().manual_seed(0))
    compiled = Mamba2Block(64, **kwargs).cuda()
    compiled.load_state_dict(eager.state_dict())
    counters.clear()
    compiled.compile(dynamic=False, fullgraph=True)
    u = torch.randn(2, 300, 64, device="cuda")
    outs = []
    for block in (eager, compiled):
        leaf = u.clone().requires_grad_()
        y = block(leaf)
        y.square().mean().backward()
        outs.append((y.detach(), leaf.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-3, atol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_model_matches_the_chunked_model_under_bf16_autocast_loosely(backend):
    cfgs = {s: ModelConfig(d_model=32, mamba=MambaConfig(d_state=16, headdim=16, ssd=s)) for s in ("chunked", backend)}
    x, dt = torch.randn(2, 500, 6, device="cuda"), torch.rand(2, 500, device="cuda") + 0.5
    logits = {}
    for s, cfg in cfgs.items():
        model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0).cuda()
        model.set_dt_scale(1.0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[s] = model(x, dt)
        assert logits[s].dtype == torch.float32 and torch.isfinite(logits[s]).all()
    torch.testing.assert_close(logits[backend], logits["chunked"], rtol=0.05, atol=0.05)
