"""Autograd and fake (meta) registrations of the pool ops whose schemas live in csrc/ops.cpp.

Imported by `perception.ops.extension` once the library is loaded. Each forward op also returns what its
one-pass backward needs (softmax max, sum and scores, attention, means); those extra outputs are not differentiable."""

from __future__ import annotations

import torch

SUPPORTED_D = (16, 32, 64, 128)


def kernel_supports(*tensors: torch.Tensor) -> bool:
    """The kernels take fp32 with hidden size D (last dim) in SUPPORTED_D; others use the references."""
    return all(t.dtype == torch.float32 for t in tensors) and tensors[0].shape[-1] in SUPPORTED_D


# --- attention_pool(lnb (B,K,D), q (Q,D)) -> ctx (B,Q,D), stats (B,Q,2) = max, sum; scores (B,K,Q) ---


@torch.library.register_fake("perception::attention_pool")
def _attention_pool_fake(lnb, q):
    b, q_n = lnb.shape[0], q.shape[0]
    return lnb.new_empty((b, q_n, lnb.shape[2])), lnb.new_empty((b, q_n, 2)), lnb.new_empty((b, lnb.shape[1], q_n))


@torch.library.register_fake("perception::attention_pool_bwd")
def _attention_pool_bwd_fake(grad_ctx, lnb, q, ctx, stats, scores):
    return torch.empty_like(lnb), torch.empty_like(q)


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
    b, _, d = lnb.shape
    return lnb.new_empty((b, d)), lnb.new_empty((b, d, d)), lnb.new_empty((b, d))


@torch.library.register_fake("perception::inverted_pool_bwd")
def _inverted_pool_bwd_fake(grad_inv, lnb, attn, mean, inv):
    return torch.empty_like(lnb)


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
    return torch.empty_like(ctx)


@torch.library.register_fake("perception::inv_pool_merge_bwd")
def _inv_pool_merge_bwd_fake(grad):
    return grad.new_empty((grad.shape[0], grad.shape[2]))


def _inv_pool_merge_setup(ctx, inputs, output):
    pass


def _inv_pool_merge_backward(ctx, grad):
    # d_ctx is grad itself; d_inv[b, d] = sum_q grad[b, q, d] in one small kernel.
    return grad, torch.ops.perception.inv_pool_merge_bwd(grad.contiguous())


torch.library.register_autograd(
    "perception::inv_pool_merge", _inv_pool_merge_backward, setup_context=_inv_pool_merge_setup
)
