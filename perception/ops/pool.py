"""Autograd and fake (meta) registrations of the pool family, whose schemas live in csrc/pool.cpp.

Imported by `perception.ops.extension` once the library is loaded. Each forward op also returns what its
one-pass backward needs (softmax max, sum and scores, attention, means); those extra outputs are not differentiable.
The fakes are exact: they check what the kernels' entry points check and return the kernels' (contiguous) outputs."""

from __future__ import annotations

import torch

from perception.ops import KERNEL_WIDTHS
from perception.ops.common import check_fp32, check_shape, check_width


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


@torch.library.register_fake("perception::attention_pool")
def _attention_pool_fake(lnb, q):
    _check_pool_inputs("attention_pool", lnb, q)
    b, k, d = lnb.shape
    q_n = q.shape[0]
    return lnb.new_empty((b, q_n, d)), lnb.new_empty((b, q_n, 2)), lnb.new_empty((b, k, q_n))


@torch.library.register_fake("perception::attention_pool_bwd")
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


torch.library.register_autograd(
    "perception::attention_pool", _attention_pool_backward, setup_context=_attention_pool_setup
)


# --- inverted_pool(lnb (B,K,D)) -> inv (B,D), attn (B,D,D), mean (B,D) ------------------------------


@torch.library.register_fake("perception::inverted_pool")
def _inverted_pool_fake(lnb):
    _check_lnb("inverted_pool", lnb)
    b, _, d = lnb.shape
    return lnb.new_empty((b, d)), lnb.new_empty((b, d, d)), lnb.new_empty((b, d))


@torch.library.register_fake("perception::inverted_pool_bwd")
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


torch.library.register_autograd(
    "perception::inverted_pool", _inverted_pool_backward, setup_context=_inverted_pool_setup
)


# --- inv_pool_merge(ctx (B,Q,D), inv (B,D)) -> ctx + inv over every query ----------------------------


@torch.library.register_fake("perception::inv_pool_merge")
def _inv_pool_merge_fake(ctx, inv):
    op = "inv_pool_merge"  # any D: the merge is elementwise
    check_fp32(op, ctx=ctx, inv=inv)
    torch._check(ctx.dim() == 3, lambda: f"{op}: ctx must be (B, Q, D), got {list(ctx.shape)}")
    check_shape(op, "inv", inv, (ctx.shape[0], ctx.shape[2]))
    return ctx.new_empty(ctx.shape)


@torch.library.register_fake("perception::inv_pool_merge_bwd")
def _inv_pool_merge_bwd_fake(grad):
    check_fp32("inv_pool_merge_bwd", grad=grad)
    torch._check(grad.dim() == 3, lambda: f"inv_pool_merge_bwd: grad must be (B, Q, D), got {list(grad.shape)}")
    return grad.new_empty((grad.shape[0], grad.shape[2]))


def _inv_pool_merge_setup(ctx, inputs, output):
    pass


def _inv_pool_merge_backward(ctx, grad):
    # d_ctx is grad itself; d_inv[b, d] = sum_q grad[b, q, d] in one small kernel.
    return grad, torch.ops.perception.inv_pool_merge_bwd(grad.contiguous())


torch.library.register_autograd(
    "perception::inv_pool_merge", _inv_pool_merge_backward, setup_context=_inv_pool_merge_setup
)
