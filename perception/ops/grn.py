"""The grn family: the VSN's per-variable GRNs weighted by the selection weights (DESIGN §3),
    out[..., f, :] = v[..., f] · (LN(e_f + GLU(W2_f · ELU(W1_f · e_f + b1_f) + b2_f)) · lnw_f + lnb_f).

Top to bottom: the public op, which takes the Triton kernels or the reference by `backend`; the reference
`grn_select_ref` (the kernels' oracle and the CPU path, with autograd for its backward); the kernels' forward
and backward as `torch.library` custom ops with exact fakes; their autograd. The kernels (grn_kernels.py)
read e and v once and write the weighted output once; the reference materialises every intermediate, which
at production size is several (B, K, F, 2·d) tensors a step."""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from perception.enums import enum_value
from perception.ops.common import upcast

# d_var the kernels take: a power of two (Triton's tiles), at most 8: a thread holds its row's d-vectors, and the
# backward takes 206 registers at d = 8 (benchmarks/results/grn_compile.json)
GRN_WIDTHS = (2, 4, 8)
# How the kernels are launched (benchmarks/ops_grn.py sweeps these): rows a program holds at once in the forward
# and in the backward, one per lane (warps = rows / 32), and row ranges per variable (F times as many programs,
# each with its own weight-gradient partial). The backward's 32 keeps its registers under the limit without
# spilling (`triton.compile` for sm_90, Triton 3.6: 206 registers at 32 rows, 209 at 64, spills at 128)
LAUNCH = {"fwd_rows": 128, "bwd_rows": 32, "programs_per_variable": 64}


@functools.cache  # once a process
def _kernels() -> types.ModuleType | None:
    """grn_kernels, or None where Triton does not import (CPU builds of torch ship without it)."""
    try:
        from perception.ops import grn_kernels
    except ImportError:
        return None
    return grn_kernels


def grn_kernels_take(backend: str, e: torch.Tensor) -> bool:
    """model.ops: `ref` never, `cuda` always for CUDA tensors (the kernels' checks then say what they expected),
    `auto` for CUDA tensors with Triton and d_var in GRN_WIDTHS."""
    backend = enum_value(backend)
    if backend == "ref":
        return False
    if backend == "cuda":
        if not e.is_cuda:
            raise ValueError("model.ops=cuda needs CUDA tensors; got a CPU tensor (set trainer.device=cuda)")
        return True
    return e.is_cuda and e.shape[-1] in GRN_WIDTHS and _kernels() is not None


def grn_select(
    e: torch.Tensor,
    v: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """e: (..., F, d), v: (..., F), fc1_w: (F, d, d), fc2_w: (F, 2d, d), biases and LN weights (F, ·)
    -> (..., F, d): each variable's GRN of its embedding, times its selection weight. Returns v's dtype
    promoted with e's (fp32 under autocast: e and v are fp32 there)."""
    weights = (fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    if grn_kernels_take(backend, e):
        lead = e.shape[:-2]
        f, d = e.shape[-2:]
        out = grn_select_fwd(e.reshape(-1, f, d), v.reshape(-1, f), *weights)
        return out.reshape(*lead, f, d)
    return grn_select_ref(e, v, *weights)


def grn_select_ref(
    e: torch.Tensor,
    v: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
) -> torch.Tensor:
    """The equations: one Linear per variable as an einsum over F, ELU, GLU (value half first), LayerNorm
    over d with per-variable affine weights, times v."""
    e, v = upcast(e), upcast(v)
    h = torch.einsum("...fi,foi->...fo", e, upcast(fc1_w)) + upcast(fc1_b)  # (..., F, d)
    h = torch.einsum("...fi,foi->...fo", F.elu(h), upcast(fc2_w)) + upcast(fc2_b)  # (..., F, 2d)
    z = F.layer_norm(e + F.glu(h, dim=-1), e.shape[-1:])  # (..., F, d)
    return v.unsqueeze(-1) * (z * upcast(ln_w) + upcast(ln_b))


def _check(op: str, e: torch.Tensor, v: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> None:
    """What the kernels assume, as torch checks (the fakes run them too, so a compiled program fails at trace)."""
    torch._check(e.dim() == 3, lambda: f"{op}: e must be (N, F, d), got shape {list(e.shape)}")
    n, f, d = e.shape
    torch._check(d in GRN_WIDTHS, lambda: f"{op}: kernels take d_var in {GRN_WIDTHS}, got {d} (use model.ops=ref)")
    torch._check(list(v.shape) == [n, f], lambda: f"{op}: v must be (N, F) = {[n, f]}, got shape {list(v.shape)}")
    shapes = ((f, d, d), (f, d), (f, 2 * d, d), (f, 2 * d), (f, d), (f, d))
    names = ("fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln_w", "ln_b")
    for name, w, shape in zip(names, weights, shapes):
        torch._check(list(w.shape) == list(shape), lambda: f"{op}: {name} must be {list(shape)}, got {list(w.shape)}")
    for name, t in (("e", e), ("v", v), *zip(names, weights)):
        torch._check(
            t.dtype in (torch.float32, torch.bfloat16, torch.float16),
            lambda: f"{op}: {name} must be float32, bfloat16 or float16, got {t.dtype}",
        )


def _grid(n: int, block: int) -> tuple[int, int]:
    """(rows per program, programs per variable): at most LAUNCH's ranges, each whole blocks of `block` rows."""
    ranges = max(1, min(LAUNCH["programs_per_variable"], _ceil_div(n, block)))
    rows = _ceil_div(_ceil_div(n, ranges), block) * block
    return rows, _ceil_div(n, rows)


def _launch(kernel, block: int, e: torch.Tensor, *args) -> None:
    """Run `kernel` over (F, programs) in blocks of `block` rows, a multiple of 32: one row per lane."""
    n, f, d = e.shape
    rows, programs = _grid(n, block)
    kernel[(f, programs)](*args, n, f, rows, D=d, BLOCK_N=block, num_warps=block // 32)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@torch.library.custom_op("perception::grn_select_fwd", mutates_args=(), device_types="cuda")
def grn_select_fwd(
    e: torch.Tensor,
    v: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
) -> torch.Tensor:
    """e: (N, F, d), v: (N, F) -> (N, F, d) in the promoted dtype of e and v."""
    weights = (fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_fwd", e, v, weights)
    kernels = require_grn_kernels()
    e, v = e.contiguous(), v.contiguous()
    out = torch.empty(e.shape, dtype=torch.promote_types(e.dtype, v.dtype), device=e.device)
    w1t, w2t = _transposed(fc1_w), _transposed(fc2_w)
    b1, b2, lnw, lnb = (w.contiguous() for w in (fc1_b, fc2_b, ln_w, ln_b))
    with torch.cuda.device(e.device):
        _launch(kernels.grn_select_fwd_kernel, LAUNCH["fwd_rows"], e, e, v, w1t, b1, w2t, b2, lnw, lnb, out)
    return out


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """(F, out, in) -> (F, in, out), contiguous: the kernels read W's columns as Wᵀ's contiguous rows."""
    return w.transpose(1, 2).contiguous()


@grn_select_fwd.register_fake
def _(e, v, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b):
    _check("grn_select_fwd", e, v, (fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b))
    return e.new_empty(e.shape, dtype=torch.promote_types(e.dtype, v.dtype))


@torch.library.custom_op("perception::grn_select_bwd", mutates_args=(), device_types="cuda")
def grn_select_bwd(
    grad: torch.Tensor,
    e: torch.Tensor,
    v: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]:
    """-> (de, dv, dfc1_w, dfc1_b, dfc2_w, dfc2_b, dln_w, dln_b), each shaped and typed as its input. The
    weight gradients are the per-program partials summed over programs by torch (a fixed order)."""
    weights = (fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_bwd", e, v, weights)
    kernels = require_grn_kernels()
    n, f, d = e.shape
    e, v, grad = e.contiguous(), v.contiguous(), grad.contiguous()
    de, dv = torch.empty_like(e), torch.empty_like(v)
    per_variable = 3 * d * d + 5 * d
    block = LAUNCH["bwd_rows"]
    partial = torch.empty((_grid(n, block)[1], f, per_variable), dtype=torch.float32, device=e.device)
    with torch.cuda.device(e.device):
        _launch(
            kernels.grn_select_bwd_kernel, block, e, grad, e, v, *(w.contiguous() for w in weights), de, dv, partial
        )
    sums = partial.sum(0)  # (F, per_variable): every program wrote its row
    dw1, db1, dw2a, dw2b, db2a, db2b, dlnw, dlnb = sums.split([d * d, d, d * d, d * d, d, d, d, d], dim=1)
    grads = (
        dw1.reshape(f, d, d),
        db1,
        torch.cat([dw2a.reshape(f, d, d), dw2b.reshape(f, d, d)], dim=1),
        torch.cat([db2a, db2b], dim=1),
        dlnw,
        dlnb,
    )
    return (de, dv, *(g.to(w.dtype, copy=True) for g, w in zip(grads, weights)))  # type: ignore[return-value]


@grn_select_bwd.register_fake
def _(grad, e, v, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b):
    weights = (fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_bwd", e, v, weights)
    return (torch.empty_like(e), torch.empty_like(v), *(torch.empty_like(w) for w in weights))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # the backward recomputes the forward from e: nothing else is kept


def _backward(ctx, grad):
    return grn_select_bwd(grad, *ctx.saved_tensors)


grn_select_fwd.register_autograd(_backward, setup_context=_setup_context)


def require_grn_kernels() -> types.ModuleType:
    """grn_kernels, or an error saying what is missing (the image checks it: experiment=production runs them)."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("the grn kernels need Triton (a CUDA build of torch ships it); use model.ops=ref")
    return kernels
