"""The grn family: the VSN's per-variable embeddings and GRNs weighted by the selection weights (DESIGN §3),
    out[..., f, :] = v[..., f] · (LN(e_f + GLU(W2_f · ELU(W1_f · e_f + b1_f) + b2_f)) · lnw_f + lnb_f),
    e_f = x[..., f] · ew_f + eb_f.

Top to bottom: the public op, which takes the Triton kernels or the reference by `backend`; the reference
`grn_select_ref` (the kernels' oracle and the CPU path, with autograd for its backward); the kernels' forward
and backward as `torch.library` custom ops with exact fakes; their autograd. The kernels (grn_kernels.py)
read x and v once and write the weighted output once (the embedding is theirs: neither it nor its gradient
reaches memory); the reference materialises every intermediate, which at production size is several
(B, K, F, 2·d) tensors a step."""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from perception.enums import enum_value
from perception.ops.common import upcast

# d_var the kernels take: a power of two (Triton's tiles), at most 8: a thread holds its row's d-vectors, and the
# backward takes 198 registers at d = 8 on sm_90, 255 on sm_89 (benchmarks/results/grn_compile.json)
GRN_WIDTHS = (2, 4, 8)
# How the kernels are launched (benchmarks/ops_grn.py sweeps these): rows a program holds at once in the forward
# and in the backward, one per lane (warps = rows / 32), and row ranges per variable (F times as many programs,
# each with its own weight-gradient partial). The backward's 32 keeps its registers under the limit without
# spilling (`triton.compile`, Triton 3.6: 32 rows fit on sm_89 and sm_90, 64 and 128 spill)
LAUNCH = {"fwd_rows": 128, "bwd_rows": 32, "programs_per_variable": 64}
WEIGHT_NAMES = ("embed_w", "embed_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln_w", "ln_b")  # the op's, in order


@functools.cache  # once a process
def _kernels() -> types.ModuleType | None:
    """grn_kernels, or None where Triton does not import (CPU builds of torch ship without it)."""
    try:
        from perception.ops import grn_kernels
    except ImportError:
        return None
    return grn_kernels


def grn_kernels_take(backend: str, x: torch.Tensor, d: int) -> bool:
    """model.ops: `ref` never, `cuda` always for CUDA tensors (the kernels' checks then say what they expected),
    `auto` for CUDA tensors with Triton and d_var `d` in GRN_WIDTHS."""
    backend = enum_value(backend)
    if backend == "ref":
        return False
    if backend == "cuda":
        if not x.is_cuda:
            raise ValueError("model.ops=cuda needs CUDA tensors; got a CPU tensor (set trainer.device=cuda)")
        return True
    return x.is_cuda and d in GRN_WIDTHS and _kernels() is not None


def grn_select(
    x: torch.Tensor,
    v: torch.Tensor,
    embed_w: torch.Tensor,
    embed_b: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """x: (..., F) features, v: (..., F) selection weights, embed_w, embed_b: (F, d), fc1_w: (F, d, d),
    fc2_w: (F, 2d, d), biases and LN weights (F, ·) -> (..., F, d): each variable's GRN of its embedding
    x·embed_w + embed_b, times its selection weight. In `out_dtype`, else x's promoted with v's (the kernels
    round their fp32 result once; under autocast the VSN asks for its dtype, which the linear after reads)."""
    weights = (embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    if grn_kernels_take(backend, x, embed_w.shape[-1]):
        f, d = embed_w.shape
        out = grn_select_fwd(x.reshape(-1, f), v.reshape(-1, f), *weights, out_dtype)
        return out.reshape(*x.shape, d)
    out = grn_select_ref(x, v, *weights)
    return out if out_dtype is None else out.to(out_dtype)


def grn_select_ref(
    x: torch.Tensor,
    v: torch.Tensor,
    embed_w: torch.Tensor,
    embed_b: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
) -> torch.Tensor:
    """The equations: the embedding, one Linear per variable as an einsum over F, ELU, GLU (value half first),
    LayerNorm over d with per-variable affine weights, times v."""
    x, v = upcast(x), upcast(v)
    e = x.unsqueeze(-1) * upcast(embed_w) + upcast(embed_b)  # (..., F, d)
    h = torch.einsum("...fi,foi->...fo", e, upcast(fc1_w)) + upcast(fc1_b)  # (..., F, d)
    h = torch.einsum("...fi,foi->...fo", F.elu(h), upcast(fc2_w)) + upcast(fc2_b)  # (..., F, 2d)
    z = F.layer_norm(e + F.glu(h, dim=-1), e.shape[-1:])  # (..., F, d)
    return v.unsqueeze(-1) * (z * upcast(ln_w) + upcast(ln_b))


def _check(op: str, x: torch.Tensor, v: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> None:
    """What the kernels assume, as torch checks (the fakes run them too, so a compiled program fails at trace)."""
    torch._check(x.dim() == 2, lambda: f"{op}: x must be (N, F), got shape {list(x.shape)}")
    n, f = x.shape
    embed_w = weights[0]
    torch._check(embed_w.dim() == 2, lambda: f"{op}: embed_w must be (F, d), got shape {list(embed_w.shape)}")
    d = embed_w.shape[1]
    torch._check(d in GRN_WIDTHS, lambda: f"{op}: kernels take d_var in {GRN_WIDTHS}, got {d} (use model.ops=ref)")
    torch._check(list(v.shape) == [n, f], lambda: f"{op}: v must be (N, F) = {[n, f]}, got shape {list(v.shape)}")
    shapes = ((f, d), (f, d), (f, d, d), (f, d), (f, 2 * d, d), (f, 2 * d), (f, d), (f, d))
    for name, w, shape in zip(WEIGHT_NAMES, weights, shapes):
        torch._check(list(w.shape) == list(shape), lambda: f"{op}: {name} must be {list(shape)}, got {list(w.shape)}")
    for name, t in (("x", x), ("v", v), *zip(WEIGHT_NAMES, weights)):
        torch._check(
            t.dtype in (torch.float32, torch.bfloat16, torch.float16),
            lambda: f"{op}: {name} must be float32, bfloat16 or float16, got {t.dtype}",
        )


def _grid(n: int, block: int) -> tuple[int, int]:
    """(rows per program, programs per variable): at most LAUNCH's ranges, each whole blocks of `block` rows."""
    ranges = max(1, min(LAUNCH["programs_per_variable"], _ceil_div(n, block)))
    rows = _ceil_div(_ceil_div(n, ranges), block) * block
    return rows, _ceil_div(n, rows)


def _launch(kernel, block: int, x: torch.Tensor, d: int, *args) -> None:
    """Run `kernel` over (F, programs) in blocks of `block` rows, a multiple of 32: one row per lane."""
    n, f = x.shape
    rows, programs = _grid(n, block)
    kernel[(f, programs)](*args, n, f, rows, D=d, BLOCK_N=block, num_warps=block // 32)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@torch.library.custom_op("perception::grn_select_fwd", mutates_args=(), device_types="cuda")
def grn_select_fwd(
    x: torch.Tensor,
    v: torch.Tensor,
    embed_w: torch.Tensor,
    embed_b: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x: (N, F), v: (N, F) -> (N, F, d) in `out_dtype`, else the promoted dtype of x and v."""
    weights = (embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_fwd", x, v, weights)
    kernels = require_grn_kernels()
    x, v = x.contiguous(), v.contiguous()
    d = embed_w.shape[1]
    out = torch.empty((*x.shape, d), dtype=_out_dtype(x, v, out_dtype), device=x.device)
    w1t, w2t = _transposed(fc1_w), _transposed(fc2_w)
    ew, eb, b1, b2, lnw, lnb = (w.contiguous() for w in (embed_w, embed_b, fc1_b, fc2_b, ln_w, ln_b))
    with torch.cuda.device(x.device):
        _launch(kernels.grn_select_fwd_kernel, LAUNCH["fwd_rows"], x, d, x, v, ew, eb, w1t, b1, w2t, b2, lnw, lnb, out)
    return out


def _out_dtype(x: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    return out_dtype if out_dtype is not None else torch.promote_types(x.dtype, v.dtype)


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """(F, out, in) -> (F, in, out), contiguous: the kernels read W's columns as Wᵀ's contiguous rows."""
    return w.transpose(1, 2).contiguous()


@grn_select_fwd.register_fake
def _(x, v, embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b, out_dtype=None):
    _check("grn_select_fwd", x, v, (embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b))
    return x.new_empty((*x.shape, embed_w.shape[1]), dtype=_out_dtype(x, v, out_dtype))


@torch.library.custom_op("perception::grn_select_bwd", mutates_args=(), device_types="cuda")
def grn_select_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    v: torch.Tensor,
    embed_w: torch.Tensor,
    embed_b: torch.Tensor,
    fc1_w: torch.Tensor,
    fc1_b: torch.Tensor,
    fc2_w: torch.Tensor,
    fc2_b: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
) -> list[torch.Tensor]:
    """-> [dx, dv, dembed_w, dembed_b, dfc1_w, dfc1_b, dfc2_w, dfc2_b, dln_w, dln_b], each shaped and typed as its
    input. The weight gradients are the per-program partials summed over programs by torch (a fixed order)."""
    weights = (embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_bwd", x, v, weights)
    kernels = require_grn_kernels()
    n, f = x.shape
    d = embed_w.shape[1]
    x, v, grad = x.contiguous(), v.contiguous(), grad.contiguous()
    dx, dv = torch.empty_like(x), torch.empty_like(v)
    per_variable = 3 * d * d + 7 * d
    block = LAUNCH["bwd_rows"]
    partial = torch.empty((_grid(n, block)[1], f, per_variable), dtype=torch.float32, device=x.device)
    with torch.cuda.device(x.device):
        _launch(
            kernels.grn_select_bwd_kernel, block, x, d, grad, x, v, *(w.contiguous() for w in weights), dx, dv, partial
        )
    sums = partial.sum(0)  # (F, per_variable): every program wrote its row
    dw1, db1, dw2a, dw2b, db2a, db2b, dlnw, dlnb, dew, deb = sums.split([d * d, d, d * d, d * d, d, d, d, d, d, d], 1)
    grads = (
        dew,
        deb,
        dw1.reshape(f, d, d),
        db1,
        torch.cat([dw2a.reshape(f, d, d), dw2b.reshape(f, d, d)], dim=1),
        torch.cat([db2a, db2b], dim=1),
        dlnw,
        dlnb,
    )
    return [dx, dv, *(g.to(w.dtype, copy=True) for g, w in zip(grads, weights))]


@grn_select_bwd.register_fake
def _(grad, x, v, embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b):
    weights = (embed_w, embed_b, fc1_w, fc1_b, fc2_w, fc2_b, ln_w, ln_b)
    _check("grn_select_bwd", x, v, weights)
    return [torch.empty_like(x), torch.empty_like(v), *(torch.empty_like(w) for w in weights)]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:-1])  # the backward recomputes the forward from x: nothing else is kept


def _backward(ctx, grad):
    return (*grn_select_bwd(grad, *ctx.saved_tensors), None)


grn_select_fwd.register_autograd(_backward, setup_context=_setup_context)


def require_grn_kernels() -> types.ModuleType:
    """grn_kernels, or an error saying what is missing (the image checks it: experiment=production runs them)."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("the grn kernels need Triton (a CUDA build of torch ships it); use model.ops=ref")
    return kernels
