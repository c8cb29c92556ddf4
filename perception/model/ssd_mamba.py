"""The Mamba2 SSD scan through mamba_ssm's fused chunked-scan Triton kernels, CUDA only
(`model.mamba.ssd=mamba`). The same contract as `ssd_scan` (y = SSD(dt·x) + D·x, B and C one group shared by
all heads): `mamba_chunk_scan_combined` is the reference Mamba2's own call, the chunk scan's forward in five
kernels and its backward (recomputing the chunk states) in about a dozen, for sm_89 and sm_90 alike.

Determinism: the library's deterministic mode (`mamba_ssm.utils.determinism`) is switched on once the
kernels are loaded: its backward then reduces per-tile partials in a fixed order instead of with atomics.
Every autotuned kernel runs one configuration, so the bits do not depend on a per-process autotuning race:
the library's deterministic choice, the cheapest (smallest tiles), or with PIN_CONFIGS the autotuner's choices
at production size fixed here (`PINNED_CONFIGS`). Its forward and backward are wrapped as two `torch.library`
custom ops with exact fakes, so a compiled Mamba2 block traces through them without a graph break."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import warnings

import torch

from perception.errors import ConfigError

MAMBA_REQUIREMENT = "mamba-ssm==2.3.2.post1"  # internal entry points below are pinned to this release
# a wheel without its CUDA extensions: only the Triton kernels are used
MAMBA_INSTALL = (
    f"MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-deps --no-build-isolation "
    f"'{MAMBA_REQUIREMENT}' einops"
)


# The modules holding the autotuned kernels ssd_combined runs, imported in this order.
KERNEL_MODULES = ("ssd_bmm", "ssd_chunk_state", "ssd_state_passing", "ssd_chunk_scan", "k_activations", "ssd_combined")

# False runs the deterministic mode's smallest tiles instead (docs/performance.md "mamba_ssm's configurations,
# pinned").
PIN_CONFIGS = True

# kernel -> (block sizes, num_warps, num_stages): Triton's autotuner's choices for one block's chunk scan at
# production size (B 64, K 6000, 8 heads of 32, d_state 64, chunk 128) on an H100, benchmarks/mamba_configs.py.
# In the library's deterministic mode every kernel runs its smallest tiles instead (the cheapest configuration).
PINNED_CONFIGS = {
    "_bmm_chunk_fwd_kernel": (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32), 4, 4),
    "_bmm_chunk_bwd_kernel": (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_CS=32), 4, 4),
    "_chunk_cumsum_fwd_kernel": (dict(BLOCK_SIZE_H=8), 4, 3),
    "_chunk_cumsum_bwd_kernel": (dict(BLOCK_SIZE_H=8), 4, 3),
    "_chunk_state_fwd_kernel": (dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32), 2, 5),
    "_chunk_state_bwd_db_kernel": (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=32), 4, 3),
    "_state_passing_fwd_kernel": (dict(BLOCK_SIZE=512), 4, 3),
    "_state_passing_bwd_kernel": (dict(BLOCK_SIZE=1024), 4, 3),
    "_chunk_scan_fwd_kernel": (dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32), 2, 5),
    "_chunk_scan_bwd_dstates_kernel": (dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32), 2, 5),
    "_chunk_scan_bwd_dc_kernel": (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=32), 4, 3),
    "_chunk_scan_bwd_dcb_kernel": (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=32), 4, 3),
    "_chunk_scan_bwd_ddAcs_stable_kernel": (dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32), 4, 3),
    "_chunk_scan_chunk_state_bwd_dx_kernel": (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32), 4, 5),
}

# Module constants the library derives at import from a kernel's configurations: how many per-tile partials its
# deterministic backward allocates (the smallest BLOCK_SIZE_N); they follow the pinned configurations.
MIN_BLOCK_N = {
    ("ssd_chunk_scan", "_CHUNK_SCAN_BWD_DC_MIN_BLOCK_N"): "_chunk_scan_bwd_dc_kernel",
    ("ssd_chunk_scan", "_CHUNK_SCAN_BWD_DX_MIN_BLOCK_N"): "_chunk_scan_bwd_dx_kernel",
    ("ssd_chunk_state", "_CHUNK_STATE_BWD_DX_MIN_BLOCK_N"): "_chunk_state_bwd_dx_kernel",
    ("ssd_chunk_state", "_CHUNK_STATE_BWD_DB_MIN_BLOCK_N"): "_chunk_state_bwd_db_kernel",
    ("ssd_chunk_state", "_CHUNK_STATE_BWD_DDACS_MIN_BLOCK_N"): "_chunk_state_bwd_ddAcs_stable_kernel",
    ("ssd_combined", "_CHUNK_SCAN_CHUNK_STATE_BWD_DX_MIN_BLOCK_N"): "_chunk_scan_chunk_state_bwd_dx_kernel",
}


@functools.cache  # once a process: every op call asks for it
def _ssd_combined() -> types.ModuleType:
    """mamba_ssm.ops.triton.ssd_combined, deterministic, every autotuned kernel at one fixed configuration."""
    mamba_package()
    from mamba_ssm.utils import determinism

    if not PIN_CONFIGS:
        determinism.set_deterministic_mode(True)  # at import: each kernel keeps its cheapest configuration
        # the cheapest configuration is the deterministic mode's documented choice; its hint to autotune is not taken
        warnings.filterwarnings("ignore", message="Deterministic mode: ", module="mamba_ssm")
        return importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    if any(f"mamba_ssm.ops.triton.{name}" in sys.modules for name in KERNEL_MODULES):
        raise RuntimeError("mamba_ssm's SSD kernels were imported before perception pinned their configurations")
    determinism.set_deterministic_mode(False)  # imported with every configuration, then one kept per kernel
    modules = {name: importlib.import_module(f"mamba_ssm.ops.triton.{name}") for name in KERNEL_MODULES}
    determinism.set_deterministic_mode(True)
    pin_configs(modules.values(), determinism._estimate_config_cost)
    for (module, constant), kernel in MIN_BLOCK_N.items():
        configs = getattr(modules[module], kernel).configs
        setattr(modules[module], constant, min(c.kwargs["BLOCK_SIZE_N"] for c in configs))
    return modules["ssd_combined"]


def pin_configs(modules, cost) -> None:
    """Leave every autotuned kernel in `modules` one configuration: PINNED_CONFIGS' where it names the kernel,
    else the cheapest by `cost` (the library's deterministic choice)."""
    from triton.runtime.autotuner import Autotuner

    kernels = {name: k for m in modules for name, k in vars(m).items() if isinstance(k, Autotuner)}
    missing = sorted(set(PINNED_CONFIGS) - set(kernels))
    if missing:
        raise RuntimeError(f"mamba_ssm ({MAMBA_REQUIREMENT}) has no autotuned kernels named {missing}")
    for name, kernel in kernels.items():
        if name not in PINNED_CONFIGS:
            kernel.configs = [min(kernel.configs, key=cost)]
            continue
        sizes, warps, stages = PINNED_CONFIGS[name]
        chosen = [c for c in kernel.configs if (c.kwargs, c.num_warps, c.num_stages) == (sizes, warps, stages)]
        if not chosen:
            raise RuntimeError(f"mamba_ssm's {name} has no configuration {sizes}, warps {warps}, stages {stages}")
        kernel.configs = chosen[:1]


def mamba_package() -> None:
    """Make mamba_ssm's submodules importable without running its package __init__ when that fails: it loads
    the selective-scan CUDA extension and transformers, which the SSD's Triton kernels do not use."""
    if "mamba_ssm" not in sys.modules:
        try:
            importlib.import_module("mamba_ssm")
        except ImportError:
            spec = importlib.util.find_spec("mamba_ssm")
            if spec is None or not spec.submodule_search_locations:
                raise
            package = types.ModuleType("mamba_ssm")
            package.__path__ = list(spec.submodule_search_locations)
            sys.modules["mamba_ssm"] = package


def require_mamba() -> None:
    """Raise a ConfigError naming the key when mamba_ssm's SSD kernels or Triton cannot be imported."""
    try:
        _ssd_combined()
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or Triton failing to find a driver
        raise ConfigError(
            f"model.mamba.ssd=mamba needs {MAMBA_REQUIREMENT} and Triton on a CUDA machine ({MAMBA_INSTALL}); "
            f"importing it failed: {exc}. Use model.mamba.ssd=chunked."
        ) from None


def mamba_refusal() -> str | None:
    """Why model.mamba.ssd=mamba cannot train here (require_mamba's message), or None."""
    try:
        require_mamba()
    except ConfigError as exc:
        return str(exc)
    return None


@torch.library.custom_op("perception::ssd_mamba_fwd", mutates_args=(), device_types="cuda")
def ssd_mamba_fwd(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, chunk: int
) -> torch.Tensor:
    """x: (b, K, h, p), dt: (b, K, h), A: (h,), B, C: (b, K, 1, n), D: (h,) -> y: (b, K, h, p) in x's dtype."""
    ssd = _ssd_combined()
    with torch.cuda.device(x.device):
        y, *_ = ssd._mamba_chunk_scan_combined_fwd(
            x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), chunk, D=D
        )
    return y.contiguous()  # the library's y may be a strided view; the fake says contiguous


@ssd_mamba_fwd.register_fake
def _(x, dt, A, B, C, D, chunk):
    return x.new_empty(x.shape)  # contiguous whatever x's strides (empty_like would keep them)


@torch.library.custom_op("perception::ssd_mamba_bwd", mutates_args=(), device_types="cuda")
def ssd_mamba_bwd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    chunk: int,
    y: torch.Tensor,
    grad_y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx, ddt, dA, dB, dC, dD), each shaped and typed as its input."""
    ssd = _ssd_combined()
    with torch.cuda.device(x.device):
        dx, ddt, dA, dB, dC, dD, *_ = ssd._mamba_chunk_scan_combined_bwd(
            grad_y.contiguous(), x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), y, chunk, D=D
        )
    grads = (dx, ddt, dA, dB, dC, dD)
    return tuple(g.to(t.dtype).contiguous() for g, t in zip(grads, (x, dt, A, B, C, D)))  # type: ignore[return-value]


@ssd_mamba_bwd.register_fake
def _(x, dt, A, B, C, D, chunk, y, grad_y):
    return tuple(t.new_empty(t.shape) for t in (x, dt, A, B, C, D))  # contiguous, as the op returns them


def _setup_context(ctx, inputs, output):
    x, dt, A, B, C, D, chunk = inputs
    ctx.save_for_backward(x, dt, A, B, C, D, output)
    ctx.chunk = chunk


def _backward(ctx, grad_y):
    x, dt, A, B, C, D, y = ctx.saved_tensors
    return (*ssd_mamba_bwd(x, dt, A, B, C, D, ctx.chunk, y, grad_y), None)


ssd_mamba_fwd.register_autograd(_backward, setup_context=_setup_context)


def ssd_scan_mamba(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, chunk: int
) -> torch.Tensor:
    """`ssd_scan`'s contract (x: (b, K, h, p), dt: (b, K, h), A: (h,), B, C: (b, K, n), D: (h,) -> (b, K, h, p))
    on CUDA tensors. x, B and C keep their dtype (bf16 under autocast); the library keeps dt's cumulative
    decay and the chunk states in fp32."""
    if not x.is_cuda:
        raise ConfigError(
            f"model.mamba.ssd=mamba runs on CUDA tensors only; got {x.device}. Use model.mamba.ssd=chunked."
        )
    Bg, Cg = (t.to(x.dtype).unsqueeze(2) for t in (B, C))  # (b, K, 1, n): one group
    return ssd_mamba_fwd(x, dt.float(), A.float(), Bg, Cg, D.float(), chunk)
