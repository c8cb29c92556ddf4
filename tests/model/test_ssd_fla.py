"""model.mamba.ssd=fla: the custom ops' fakes (opcheck) and the errors a machine without CUDA or fla-core, or
with a Triton that miscompiles it, gets. Its scan against the recurrence and the chunked form, compiled and
under autocast: test_ssd_backends.py."""

from __future__ import annotations

import sys

import pytest
import torch

from perception.errors import ConfigError
from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model.ssd_fla import fla_refusal, hopper_miscompiles, ssd_scan_fla

from .test_ssd_backends import ssd_inputs


def test_an_unknown_ssd_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.mamba.ssd='triton': expected one of chunked, fla"):
        PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="triton")), n_features=4, horizons=[2], seed=0)


def test_fla_without_fla_core_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # makes `import fla...` fail as on a machine without it
    with pytest.raises(ConfigError, match=r"model.mamba.ssd=fla needs fla-core==0.6.0 and Triton"):
        PerceptionModel(ModelConfig(mamba=MambaConfig(ssd="fla")), n_features=4, horizons=[2], seed=0)


def test_the_fla_scan_refuses_cpu_tensors():
    with pytest.raises(ConfigError, match=r"runs on CUDA tensors only; got cpu"):
        ssd_scan_fla(*[t.float() for t in ssd_inputs(k=8)])


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
