"""model.mamba.ssd=mamba: mamba_ssm's fused chunk scan against the recurrence `ssd_scan_sequential` (fp64),
gradients against the chunked reference, the custom ops' fakes (opcheck), a compiled Mamba2 block without
graph breaks, bitwise repeatability, and the errors a machine without CUDA or mamba_ssm gets."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from perception.errors import ConfigError
from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.mamba2 import Mamba2Block, ssd_scan, ssd_scan_sequential
from perception.model import ssd_mamba
from perception.model.ssd_mamba import _ssd_combined, mamba_refusal, ssd_scan_mamba

from .test_ssd_fla import _inputs


@pytest.fixture
def mamba():
    refusal = mamba_refusal()
    if refusal is not None:
        pytest.skip(refusal)


def test_mamba_without_mamba_ssm_is_a_config_error_naming_the_install(monkeypatch):
    # a fresh cache: a GPU machine may have loaded the kernels already in this process
    monkeypatch.setattr(ssd_mamba, "_ssd_combined", functools.cache(_ssd_combined.__wrapped__))
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # makes `import mamba_ssm` fail as on a machine without it
    with pytest.raises(ConfigError, match=r"model.mamba.ssd=mamba needs mamba-ssm==2.3.2.post1 and Triton") as err:
        PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="mamba")), n_features=4, horizons=[2], seed=0)
    assert "MAMBA_SKIP_CUDA_BUILD=TRUE" in str(err.value) and "model.mamba.ssd=chunked" in str(err.value)


def test_the_mamba_scan_refuses_cpu_tensors():
    with pytest.raises(ConfigError, match=r"model.mamba.ssd=mamba runs on CUDA tensors only; got cpu"):
        ssd_scan_mamba(*[t.float() for t in _inputs(k=8)], chunk=64)


@pytest.mark.parametrize("k", [200, 256, 1000])
@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_mamba_scan_equals_the_recurrence(k):
    inputs = _inputs(k=k, device="cuda")
    want = ssd_scan_sequential(*inputs)  # fp64
    got = ssd_scan_mamba(*[t.float() for t in inputs], chunk=64)
    # the library's dots on fp32 inputs run in TF32 (Triton's default): about 1e-3 relative
    assert (got.double() - want).abs().max() / want.abs().max() < 5e-3


@pytest.mark.parametrize("k", [200, 1000])
@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_mamba_scan_gradients_equal_the_chunked_ones(k):
    inputs = _inputs(k=k, device="cuda")
    leaves32 = [t.float().requires_grad_() for t in inputs]
    leaves64 = [t.clone().requires_grad_() for t in inputs]
    grad = torch.randn(inputs[0].shape, dtype=torch.float64, device="cuda")
    ssd_scan(*leaves64, chunk=64).backward(grad)
    ssd_scan_mamba(*leaves32, chunk=64).backward(grad.float())
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D"), leaves32, leaves64):
        scale = b.grad.abs().max().item()
        err = (a.grad.double() - b.grad).abs().max().item()
        assert err <= 1e-2 * scale, f"d{name}: max error {err:.3g} against max |grad| {scale:.3g}"


@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_custom_ops_fakes_and_autograd_pass_opcheck(dtype):
    from perception.model.ssd_mamba import ssd_mamba_bwd, ssd_mamba_fwd

    x, dt, A, B, C, D = _inputs(k=130, device="cuda")
    args = [x.to(dtype), dt.float(), A.float(), B.to(dtype).unsqueeze(2), C.to(dtype).unsqueeze(2), D.float()]
    args = [t.requires_grad_() for t in args]
    torch.library.opcheck(
        ssd_mamba_fwd, [*args, 64], test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    )
    y = ssd_mamba_fwd(*[t.detach() for t in args], 64)
    torch.library.opcheck(
        ssd_mamba_bwd,
        [*[t.detach() for t in args], 64, y, torch.randn_like(y)],
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_mamba_block_matches_eager_without_graph_breaks():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    kwargs = dict(d_state=32, headdim=16, expand=2, d_conv=4, chunk=64, ssd="mamba")
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


@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_mamba_scan_and_its_gradients_repeat_bitwise():
    inputs = [
        t.to(torch.bfloat16) if i in (0, 3, 4) else t.float() for i, t in enumerate(_inputs(k=6000, device="cuda"))
    ]
    grad = torch.randn(inputs[0].shape, device="cuda", dtype=torch.bfloat16)
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = ssd_scan_mamba(*leaves, chunk=64)
        y.backward(grad)
        results.append([y.detach(), *[t.grad for t in leaves]])
    for name, a, b in zip(("y", "dx", "ddt", "dA", "dB", "dC", "dD"), *results):
        assert torch.equal(a, b), f"{name} differs between two identical calls"


@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_mamba_model_matches_the_chunked_model_under_bf16_autocast_loosely():
    cfgs = {s: ModelConfig(d_model=32, mamba=MambaConfig(d_state=16, headdim=16, ssd=s)) for s in ("chunked", "mamba")}
    x, dt = torch.randn(2, 500, 6, device="cuda"), torch.rand(2, 500, device="cuda") + 0.5
    logits = {}
    for s, cfg in cfgs.items():
        model = PerceptionModel(cfg, n_features=6, horizons=[2, 5], seed=0).cuda()
        model.set_dt_scale(1.0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[s] = model(x, dt)
        assert logits[s].dtype == torch.float32 and torch.isfinite(logits[s]).all()
    torch.testing.assert_close(logits["mamba"], logits["chunked"], rtol=0.05, atol=0.05)
