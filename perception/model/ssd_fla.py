"""The Mamba2 SSD scan through fla-core's chunked scalar-decay ("simple GLA") Triton kernels, CUDA only
(`model.mamba.ssd=fla`). Same recurrence as `ssd_scan_sequential`, renamed:

    H_t = exp(g_t) H_{t-1} + k_t ⊗ v_t,  o_t = q_t · H_t   with  q = C, k = dt·B, v = x, g = dt·A

(B and C are shared by all heads, so they are broadcast over heads; D·x is added outside). fla keeps
only q, k, v, g for backward and recomputes chunk states there, instead of the chunked reference's
[chunk x chunk] decay matrices. fla-core's own autograd Function is behind `torch.compiler.disable`,
so its forward and backward are wrapped here as two `torch.library` custom ops with exact fakes:
a compiled Mamba2 block traces through them without a graph break.

Determinism: the kernels use no atomics, but Triton autotunes tile sizes per process, and a different
tile choice sums in a different order; bitwise reproducibility across processes needs
`model.mamba.ssd=chunked`."""

from __future__ import annotations

import torch

from perception.errors import ConfigError

FLA_CHUNK = 64  # fla-core's tuned chunk length (its kernels' BT); independent of model.mamba.chunk
FLA_REQUIREMENT = "fla-core==0.6.0"  # internal entry points below are pinned to this release


def require_fla() -> None:
    """Raise a ConfigError naming the key when fla-core or Triton cannot be imported, or when this
    machine's GPU and Triton miscompile fla's backward."""
    try:
        import fla.ops.simple_gla.chunk  # noqa: F401
        import triton
    except Exception as exc:  # ImportError, or Triton failing to find a driver
        raise ConfigError(
            f"model.mamba.ssd=fla needs {FLA_REQUIREMENT} and Triton on a CUDA machine "
            f"(pip install 'perception[gpu]'); importing it failed: {exc}. Use model.mamba.ssd=chunked."
        ) from None
    if hopper_miscompiles(triton.__version__):
        raise ConfigError(
            f"model.mamba.ssd=fla: Triton {triton.__version__} miscompiles fla-core's gated backward "
            f"(chunk_bwd_dqkwg at d_state 64) on Hopper GPUs such as this "
            f"{torch.cuda.get_device_name()} (fla-org/flash-linear-attention#640; fixed in Triton 3.7.1). "
            f"Use model.mamba.ssd=chunked on this GPU, or Triton >= 3.7.1."
        )


def fla_refusal() -> str | None:
    """Why model.mamba.ssd=fla cannot train here (require_fla's message), or None."""
    try:
        require_fla()
    except ConfigError as exc:
        return str(exc)
    return None


def hopper_miscompiles(triton_version: str) -> bool:
    """True on an sm_90 GPU with 3.4.0 <= Triton < 3.7.1, where fla-core itself refuses the backward."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return False
    parts = tuple(int(p) for p in triton_version.split("+")[0].split(".")[:3] if p.isdigit())
    return (3, 4, 0) <= parts < (3, 7, 1)


def _cumsum(g: torch.Tensor, reverse: bool = False, scale: float | None = None) -> torch.Tensor:
    from fla.ops.utils import chunk_local_cumsum

    return chunk_local_cumsum(g, chunk_size=FLA_CHUNK, reverse=reverse, scale=scale)


@torch.library.custom_op("perception::ssd_fla_fwd", mutates_args=(), device_types="cuda")
def ssd_fla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """q, k: (b, K, h, n), v: (b, K, h, p) of one dtype, g: (b, K, h) fp32 log-decay -> o: (b, K, h, p)."""
    from fla.ops.simple_gla.chunk import chunk_simple_gla_fwd
    from fla.ops.utils.constant import RCP_LN2

    with torch.cuda.device(q.device):
        o, _ = chunk_simple_gla_fwd(
            q=q.contiguous(),
            k=k.contiguous(),
            v=v.contiguous(),
            g=_cumsum(g, scale=RCP_LN2),
            g_gamma=None,
            scale=1.0,
            initial_state=None,
            output_final_state=False,
            chunk_size=FLA_CHUNK,
        )
    return o.to(q.dtype)


@ssd_fla_fwd.register_fake
def _(q, k, v, g):
    return torch.empty_like(v)


@torch.library.custom_op("perception::ssd_fla_bwd", mutates_args=(), device_types="cuda")
def ssd_fla_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, grad_o: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dq, dk, dv, dg), each shaped and typed as its input."""
    from fla.ops.simple_gla.chunk import chunk_simple_gla_bwd
    from fla.ops.utils.constant import RCP_LN2

    with torch.cuda.device(q.device):
        dq, dk, dv, dg, _ = chunk_simple_gla_bwd(
            q=q.contiguous(),
            k=k.contiguous(),
            v=v.contiguous(),
            g=_cumsum(g, scale=RCP_LN2),
            g_gamma=None,
            initial_state=None,
            do=grad_o.contiguous(),
            dht=None,
            scale=1.0,
            chunk_size=FLA_CHUNK,
        )
        dg = _cumsum(dg, reverse=True)  # the gradient of the chunk-local cumsum
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype)


@ssd_fla_bwd.register_fake
def _(q, k, v, g, grad_o):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_o):
    return ssd_fla_bwd(*ctx.saved_tensors, grad_o)


ssd_fla_fwd.register_autograd(_backward, setup_context=_setup_context)


def ssd_scan_fla(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor
) -> torch.Tensor:
    """`ssd_scan`'s contract (x: (b, K, h, p), dt: (b, K, h), A: (h,), B, C: (b, K, n), D: (h,) -> (b, K, h, p))
    on CUDA tensors. q, k, v take x's dtype (bf16 under autocast); the decay stays fp32."""
    if not x.is_cuda:
        raise ConfigError(
            f"model.mamba.ssd=fla runs on CUDA tensors only; got {x.device}. Use model.mamba.ssd=chunked."
        )
    b, k, h, _ = x.shape
    n = B.shape[-1]
    q = C.to(x.dtype).unsqueeze(2).expand(b, k, h, n).contiguous()  # (b, K, h, n)
    kk = (dt.unsqueeze(-1) * B.unsqueeze(2)).to(x.dtype)  # (b, K, h, n)
    g = (dt * A).float()  # (b, K, h)
    y = ssd_fla_fwd(q, kk, x.contiguous(), g)  # (b, K, h, p)
    return y + D.view(1, 1, h, 1).to(y.dtype) * x
