"""The pool family: the attention pool, the inverted pool and their merge (schemas in csrc/pool.cpp).

Per op, top to bottom: the public op, which takes the kernel or the reference by `backend`; its pure-PyTorch
reference `<op>_ref` (the kernels' oracle and the CPU path, written as the equations of DESIGN §3, with
autograd for its backward); the fakes of the kernel's forward and backward ops; the kernel's autograd.
`register()` at the end attaches fakes and autograd to the schemas, which exist only once
`perception.ops.extension` has loaded the library, so it is the one that calls it.

Each forward op also returns what its one-pass backward needs (softmax max, sum and scores, attention, means);
those extra outputs are not differentiable. The fakes are exact: they check what the kernels' entry points
check and return the kernels' (contiguous) outputs."""

from __future__ import annotations

import math

import torch
from torch.library import register_autograd, register_fake

from perception.ops.common import KERNEL_WIDTHS, check_fp32, check_shape, check_width, upcast, use_kernels


def _pool_kernel_takes(backend: str, *tensors: torch.Tensor) -> bool:
    """Pool kernels take fp32 with D (the first tensor's last dim) in KERNEL_WIDTHS. `auto` falls back to the
    references where the answer is no; `cuda` always answers yes, so the kernel's own check names what it
    expected."""
    if getattr(backend, "value", backend) == "cuda":
        return True
    return all(t.dtype == torch.float32 for t in tensors) and tensors[0].shape[-1] in KERNEL_WIDTHS


def _check_lnb(op: str, lnb: torch.Tensor) -> None:
    check_fp32(op, lnb=lnb)
    torch._check(lnb.dim() == 3, lambda: f"{op}: lnb must be (B, K, D), got shape {list(lnb.shape)}")
    check_width(op, lnb.shape[2], KERNEL_WIDTHS)
    torch._check(lnb.shape[1] >= 1, lambda: f"{op}: K must be >= 1, got lnb {list(lnb.shape)}")


def _check_pool_inputs(op: str, lnb: torch.Tensor, q: torch.Tensor) -> None:
    _check_lnb(op, lnb)
    check_fp32(op, q=q)
    torch._check(q.dim() == 2, lambda: f"{op}: q must be (Q, D), got shape {list(q.shape)}")
    torch._check(
        q.shape[1] == lnb.shape[2], lambda: f"{op}: q must be (Q, D) with D = {lnb.shape[2]}, got shape {list(q.shape)}"
    )
    torch._check(q.shape[0] >= 1, lambda: f"{op}: Q must be >= 1, got q {list(q.shape)}")


# --- attention_pool(lnb (B,K,D), q (Q,D)) -> ctx (B,Q,D), stats (B,Q,2) = max, sum; scores (B,K,Q) ---


def attention_pool(lnb: torch.Tensor, q: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> ctx: (B, Q, D)."""
    if use_kernels(backend, lnb, q) and _pool_kernel_takes(backend, lnb, q):
        # [1:] are the softmax statistics and scores kept for backward
        return torch.ops.perception.attention_pool(lnb, q)[0]
    return attention_pool_ref(lnb, q)


def attention_weights_ref(lnb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> a: (B, Q, K), softmax over K of s = q . lnb (no extra scale)."""
    lnb, q = upcast(lnb), upcast(q)
    s = torch.einsum("qd,bkd->bqk", q, lnb)  # (B, Q, K)
    return torch.softmax(s, dim=-1)


def attention_pool_ref(lnb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> ctx: (B, Q, D) = softmax_k(q . lnb) @ lnb."""
    a = attention_weights_ref(lnb, q)  # (B, Q, K)
    return torch.einsum("bqk,bkd->bqd", a, upcast(lnb))


def _attention_pool_fake(lnb, q):
    _check_pool_inputs("attention_pool", lnb, q)
    b, k, d = lnb.shape
    q_n = q.shape[0]
    return lnb.new_empty((b, q_n, d)), lnb.new_empty((b, q_n, 2)), lnb.new_empty((b, k, q_n))


def _attention_pool_bwd_fake(grad_ctx, lnb, q, ctx, stats, scores):
    op = "attention_pool_bwd"
    _check_pool_inputs(op, lnb, q)
    b, k, d = lnb.shape
    q_n = q.shape[0]
    check_fp32(op, grad_ctx=grad_ctx, ctx=ctx, stats=stats, scores=scores)
    check_shape(op, "grad_ctx", grad_ctx, (b, q_n, d))
    check_shape(op, "ctx", ctx, (b, q_n, d))
    check_shape(op, "stats", stats, (b, q_n, 2))
    check_shape(op, "scores", scores, (b, k, q_n))
    return lnb.new_empty((b, k, d)), q.new_empty((q_n, d))


def _attention_pool_setup(ctx, inputs, output):
    lnb, q = inputs
    out, stats, scores = output
    ctx.save_for_backward(lnb, q, out, stats, scores)
    ctx.mark_non_differentiable(stats, scores)


def _attention_pool_backward(ctx, grad_ctx, _grad_stats, _grad_scores):
    lnb, q, out, stats, scores = ctx.saved_tensors
    d_lnb, d_q = torch.ops.perception.attention_pool_bwd(grad_ctx.contiguous(), lnb, q, out, stats, scores)
    return d_lnb, d_q


# --- inverted_pool(lnb (B,K,D)) -> inv (B,D), attn (B,D,D), mean (B,D) ------------------------------


def inverted_pool(lnb: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """lnb: (B, K, D) -> inv: (B, D)."""
    if use_kernels(backend, lnb) and _pool_kernel_takes(backend, lnb):
        return torch.ops.perception.inverted_pool(lnb)[0]  # [1:] are attention and means kept for backward
    return inverted_pool_ref(lnb)


def inverted_pool_ref(lnb: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D) -> inv: (B, D). Cross-variate attention: each hidden channel h attends over
    channels j with s[h, j] = K^-1/2 sum_k X[h, k] X[j, k] and pools the channels' time means."""
    x = upcast(lnb).transpose(1, 2)  # (B, D, K)
    k = x.shape[-1]
    s = torch.matmul(x, x.transpose(1, 2)) / math.sqrt(k)  # (B, D, D)
    a = torch.softmax(s, dim=-1)
    m = x.mean(dim=-1)  # (B, D)
    return torch.matmul(a, m.unsqueeze(-1)).squeeze(-1)  # (B, D)


def _inverted_pool_fake(lnb):
    _check_lnb("inverted_pool", lnb)
    b, _, d = lnb.shape
    return lnb.new_empty((b, d)), lnb.new_empty((b, d, d)), lnb.new_empty((b, d))


def _inverted_pool_bwd_fake(grad_inv, lnb, attn, mean, inv):
    op = "inverted_pool_bwd"
    _check_lnb(op, lnb)
    b, k, d = lnb.shape
    check_fp32(op, grad_inv=grad_inv, attn=attn, mean=mean, inv=inv)
    check_shape(op, "grad_inv", grad_inv, (b, d))
    check_shape(op, "attn", attn, (b, d, d))
    check_shape(op, "mean", mean, (b, d))
    check_shape(op, "inv", inv, (b, d))
    return lnb.new_empty((b, k, d))


def _inverted_pool_setup(ctx, inputs, output):
    (lnb,) = inputs
    inv, attn, mean = output
    ctx.save_for_backward(lnb, attn, mean, inv)
    ctx.mark_non_differentiable(attn, mean)


def _inverted_pool_backward(ctx, grad_inv, _grad_attn, _grad_mean):
    lnb, attn, mean, inv = ctx.saved_tensors
    return torch.ops.perception.inverted_pool_bwd(grad_inv.contiguous(), lnb, attn, mean, inv)


# --- inv_pool_merge(ctx (B,Q,D), inv (B,D)) -> ctx + inv over every query ----------------------------


def inv_pool_merge(ctx: torch.Tensor, inv: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """ctx: (B, Q, D), inv: (B, D) -> ctx: (B, Q, D)."""
    if use_kernels(backend, ctx, inv) and _pool_kernel_takes(backend, ctx, inv):
        return torch.ops.perception.inv_pool_merge(ctx, inv)
    return inv_pool_merge_ref(ctx, inv)


def inv_pool_merge_ref(ctx: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """ctx: (B, Q, D), inv: (B, D) -> ctx + inv broadcast over every query."""
    return upcast(ctx) + upcast(inv).unsqueeze(1)


def _inv_pool_merge_fake(ctx, inv):
    op = "inv_pool_merge"  # any D: the merge is elementwise
    check_fp32(op, ctx=ctx, inv=inv)
    torch._check(ctx.dim() == 3, lambda: f"{op}: ctx must be (B, Q, D), got {list(ctx.shape)}")
    check_shape(op, "inv", inv, (ctx.shape[0], ctx.shape[2]))
    return ctx.new_empty(ctx.shape)


def _inv_pool_merge_bwd_fake(grad):
    check_fp32("inv_pool_merge_bwd", grad=grad)
    torch._check(grad.dim() == 3, lambda: f"inv_pool_merge_bwd: grad must be (B, Q, D), got {list(grad.shape)}")
    return grad.new_empty((grad.shape[0], grad.shape[2]))


def _inv_pool_merge_setup(ctx, inputs, output):
    pass


def _inv_pool_merge_backward(ctx, grad):
    # d_ctx is grad itself; d_inv[b, d] = sum_q grad[b, q, d] in one small kernel.
    return grad, torch.ops.perception.inv_pool_merge_bwd(grad.contiguous())


# ------------------------------------------------------------- registration ------------------------


def register() -> None:
    """Fakes and autograd of the pool family's kernels; needs their schemas, so the loaded library."""
    register_fake("perception::attention_pool", _attention_pool_fake)
    register_fake("perception::attention_pool_bwd", _attention_pool_bwd_fake)
    register_autograd("perception::attention_pool", _attention_pool_backward, setup_context=_attention_pool_setup)
    register_fake("perception::inverted_pool", _inverted_pool_fake)
    register_fake("perception::inverted_pool_bwd", _inverted_pool_bwd_fake)
    register_autograd("perception::inverted_pool", _inverted_pool_backward, setup_context=_inverted_pool_setup)
    register_fake("perception::inv_pool_merge", _inv_pool_merge_fake)
    register_fake("perception::inv_pool_merge_bwd", _inv_pool_merge_bwd_fake)
    register_autograd("perception::inv_pool_merge", _inv_pool_merge_backward, setup_context=_inv_pool_merge_setup)
