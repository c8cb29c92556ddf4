"""model.mamba.ssd=fla: fla-core's Triton scan against the recurrence `ssd_scan_sequential` (fp64),
gradients against the chunked reference, the custom ops' fakes (opcheck), a compiled Mamba2 block
without graph breaks, and the errors a machine without CUDA or fla-core gets."""

from __future__ import annotations

import sys

import pytest
import torch

from perception.errors import ConfigError
from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.mamba2 import Mamba2Block, ssd_scan, ssd_scan_sequential
from perception.model.ssd_fla import fla_refusal, hopper_miscompiles, ssd_scan_fla


def _inputs(b=2, k=200, h=4, p=16, n=32, device="cpu", seed=0):
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


def test_an_unknown_ssd_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.mamba.ssd='triton': expected one of chunked, fla"):
        PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="triton")), n_features=4, horizons=[2], seed=0)


def test_fla_without_fla_core_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # makes `import fla...` fail as on a machine without it
    with pytest.raises(ConfigError, match=r"model.mamba.ssd=fla needs fla-core==0.6.0 and Triton"):
        PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="fla")), n_features=4, horizons=[2], seed=0)


def test_the_fla_scan_refuses_cpu_tensors():
    with pytest.raises(ConfigError, match=r"runs on CUDA tensors only; got cpu"):
        ssd_scan_fla(*[t.float() for t in _inputs(k=8)])


@pytest.fixture
def fla():
    refusal = fla_refusal()
    if refusal is not None:
        pytest.skip(refusal)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hopper_with_a_triton_that_miscompiles_fla_is_refused_before_training():
    triton = pytest.importorskip("triton")
    pytest.importorskip("fla.ops.simple_gla.chunk")
    refusal = fla_refusal()
    if hopper_miscompiles(triton.__version__):
        assert refusal is not None and "fla-org/flash-linear-attention#640" in refusal
        with pytest.raises(ConfigError, match="model.mamba.ssd=fla: Triton"):
            PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="fla")), n_features=4, horizons=[2], seed=0)
    else:
        assert refusal is None


@pytest.mark.parametrize("k", [200, 256, 1000])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fla_scan_equals_the_recurrence(k):
    pytest.importorskip("fla.ops.simple_gla.chunk", reason="model.mamba.ssd=fla needs fla-core")
    inputs = _inputs(k=k, device="cuda")
    want = ssd_scan_sequential(*inputs)  # fp64
    got = ssd_scan_fla(*[t.float() for t in inputs])
    # fla's dots on fp32 inputs run in TF32 (Triton's default): about 1e-3 relative
    assert (got.double() - want).abs().max() / want.abs().max() < 5e-3


@pytest.mark.parametrize("k", [200, 1000])
@pytest.mark.usefixtures("fla")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fla_scan_gradients_equal_the_chunked_ones(k):
    inputs = _inputs(k=k, device="cuda")
    leaves32 = [t.float().requires_grad_() for t in inputs]
    leaves64 = [t.clone().requires_grad_() for t in inputs]
    grad = torch.randn(inputs[0].shape, dtype=torch.float64, device="cuda")
    ssd_scan(*leaves64, chunk=64).backward(grad)
    ssd_scan_fla(*leaves32).backward(grad.float())
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D"), leaves32, leaves64):
        scale = b.grad.abs().max().item()
        err = (a.grad.double() - b.grad).abs().max().item()
        assert err <= 1e-2 * scale, f"d{name}: max error {err:.3g} against max |grad| {scale:.3g}"


@pytest.mark.usefixtures("fla")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_custom_ops_fakes_and_autograd_pass_opcheck(dtype):
    from perception.model.ssd_fla import ssd_fla_bwd, ssd_fla_fwd

    g = torch.Generator(device="cuda").manual_seed(0)
    b, k, h, n, p = 2, 130, 4, 32, 16
    q, kk = (torch.randn(b, k, h, n, device="cuda", generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(b, k, h, p, device="cuda", generator=g, dtype=dtype)
    gate = -torch.rand(b, k, h, device="cuda", generator=g) * 0.1
    args = [t.requires_grad_() for t in (q, kk, v, gate)]
    torch.library.opcheck(ssd_fla_fwd, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    do = torch.randn(b, k, h, p, device="cuda", generator=g, dtype=dtype)
    torch.library.opcheck(ssd_fla_bwd, [t.detach() for t in args] + [do], test_utils=("test_schema", "test_faketensor"))


@pytest.mark.usefixtures("fla")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_fla_block_matches_eager_without_graph_breaks():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    kwargs = dict(d_state=32, headdim=16, expand=2, d_conv=4, chunk=64, ssd="fla")
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


@pytest.mark.usefixtures("fla")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_fla_model_matches_the_chunked_model_under_bf16_autocast_loosely():
    cfgs = {s: ModelConfig(d_model=32, mamba=MambaConfig(d_state=16, headdim=16, ssd=s)) for s in ("chunked", "fla")}
    x, dt = torch.randn(2, 500, 6, device="cuda"), torch.rand(2, 500, device="cuda") + 0.5
    logits = {}
    for s, cfg in cfgs.items():
        model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0).cuda()
        model.set_dt_scale(1.0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[s] = model(x, dt)
        assert logits[s].dtype == torch.float32 and torch.isfinite(logits[s]).all()
    torch.testing.assert_close(logits["fla"], logits["chunked"], rtol=0.05, atol=0.05)
