"""model.mamba.ssd=mamba: the custom ops' fakes (opcheck), bitwise repeatability, and the errors a machine
without CUDA or mamba_ssm gets. Its scan against the recurrence and the chunked form, compiled and under
autocast: test_ssd_backends.py."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from perception.errors import ConfigError
from perception.model import ModelConfig, PerceptionModel
from perception.model.config import MambaConfig
from perception.model import ssd_mamba
from perception.model.ssd_mamba import _ssd_combined, mamba_refusal, ssd_scan_mamba

from .test_ssd_backends import ssd_inputs


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
        ssd_scan_mamba(*[t.float() for t in ssd_inputs(k=8)], chunk=64)


@pytest.mark.usefixtures("mamba")
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_custom_ops_fakes_and_autograd_pass_opcheck(dtype):
    from perception.model.ssd_mamba import ssd_mamba_bwd, ssd_mamba_fwd

    x, dt, A, B, C, D = ssd_inputs(k=130, device="cuda")
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
def test_the_mamba_scan_and_its_gradients_repeat_bitwise():
    inputs = [
        t.to(torch.bfloat16) if i in (0, 3, 4) else t.float() for i, t in enumerate(ssd_inputs(k=6000, device="cuda"))
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
def test_every_autotuned_kernel_runs_one_fixed_configuration():
    import importlib

    from mamba_ssm.utils.determinism import use_deterministic_mode
    from triton.runtime.autotuner import Autotuner

    _ssd_combined()
    assert use_deterministic_mode()
    seen = set()
    for name in ssd_mamba.KERNEL_MODULES:
        module = importlib.import_module(f"mamba_ssm.ops.triton.{name}")
        for kernel_name, kernel in vars(module).items():
            if not isinstance(kernel, Autotuner):
                continue
            assert len(kernel.configs) == 1, f"{kernel_name} would autotune over {len(kernel.configs)} configurations"
            if ssd_mamba.PIN_CONFIGS and kernel_name in ssd_mamba.PINNED_CONFIGS:
                config = kernel.configs[0]
                assert (config.kwargs, config.num_warps, config.num_stages) == ssd_mamba.PINNED_CONFIGS[kernel_name]
                seen.add(kernel_name)
    assert seen == (set(ssd_mamba.PINNED_CONFIGS) if ssd_mamba.PIN_CONFIGS else set())
    for (module_name, constant), kernel_name in ssd_mamba.MIN_BLOCK_N.items():
        module = importlib.import_module(f"mamba_ssm.ops.triton.{module_name}")
        assert getattr(module, constant) == getattr(module, kernel_name).configs[0].kwargs["BLOCK_SIZE_N"], constant
