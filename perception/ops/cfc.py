"""Autograd and fake (meta) registrations of the CfC family, `perception::cfc_scan` (schema in csrc/cfc.cpp).

Imported by `perception.ops.extension` once the library is loaded. The forward saves only its inputs and
h_seq; the backward recomputes z and the gate pre-activations for all steps with two GEMMs (they do not
depend on the backward recurrence), runs the backward-through-time kernel, and forms the weight gradients
as GEMMs over the per-step gradients it wrote: one fixed-order reduction per weight, no atomics.

Backward workspace at B=64, K=6000, D=128 (fp32): h_prev, z, d_pre 197 MB each; gates, d_gates 786 MB
each: 2.2 GB, freed when the backward returns. The forward keeps nothing beyond h_seq.

The fakes are exact: they check what the kernels' entry points check and return the kernels' (contiguous)
outputs."""

from __future__ import annotations

import torch

from perception.ops import KERNEL_WIDTHS
from perception.ops.common import check_fp32, check_shape, check_width
from perception.ops.reference import lecun_tanh


@torch.library.register_fake("perception::cfc_scan")
def _cfc_scan_fake(x_proj, ts, h0, w_rec, w_out, b_out):
    op = "cfc_scan"
    torch._check(x_proj.dim() == 3, lambda: f"{op}: x_proj must be (B, K, U), got {list(x_proj.shape)}")
    b, k, d = x_proj.shape
    check_fp32(op, x_proj=x_proj, ts=ts, h0=h0, w_rec=w_rec, w_out=w_out, b_out=b_out)
    for name, t, shape in [
        ("ts", ts, (b, k)),
        ("h0", h0, (b, d)),
        ("w_rec", w_rec, (d, d)),
        ("w_out", w_out, (4 * d, d)),
        ("b_out", b_out, (4 * d,)),
    ]:
        check_shape(op, name, t, shape)
    check_width(op, d, KERNEL_WIDTHS)
    return x_proj.new_empty((b, k, d))


@torch.library.register_fake("perception::cfc_scan_bwd")
def _cfc_scan_bwd_fake(grad_h, gates, z, ts, w_rec, w_out):
    op = "cfc_scan_bwd"
    torch._check(grad_h.dim() == 3, lambda: f"{op}: grad_h must be (B, K, D), got {list(grad_h.shape)}")
    b, k, d = grad_h.shape
    check_fp32(op, grad_h=grad_h, gates=gates, z=z, ts=ts, w_rec=w_rec, w_out=w_out)
    for name, t, shape in [
        ("gates", gates, (b, k, 4 * d)),
        ("z", z, (b, k, d)),
        ("ts", ts, (b, k)),
        ("w_rec", w_rec, (d, d)),
        ("w_out", w_out, (4 * d, d)),
    ]:
        check_shape(op, name, t, shape)
    check_width(op, d, KERNEL_WIDTHS)
    return grad_h.new_empty((b, k, d)), grad_h.new_empty((b, k, 4 * d)), grad_h.new_empty((b, d))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output)


def recompute(x_proj, h0, h_seq, w_rec, w_out, b_out):
    """The forward's per-step activations from its output: h_prev (B,K,D), z (B,K,U), gates (B,K,4D)."""
    h_prev = torch.cat([h0.unsqueeze(1), h_seq[:, :-1]], dim=1)  # (B, K, D)
    z = lecun_tanh(torch.addmm(x_proj.reshape(-1, x_proj.shape[-1]), h_prev.reshape(-1, h_prev.shape[-1]), w_rec.t()))
    gates = torch.addmm(b_out, z, w_out.t())  # (B*K, 4D)
    return h_prev, z.view_as(x_proj), gates.view(*x_proj.shape[:2], -1)


def _backward(ctx, grad_h):
    x_proj, ts, h0, w_rec, w_out, b_out, h_seq = ctx.saved_tensors
    d = h0.shape[1]
    h_prev, z, gates = recompute(x_proj, h0, h_seq, w_rec, w_out, b_out)
    d_pre, d_gates, d_h0 = torch.ops.perception.cfc_scan_bwd(grad_h.contiguous(), gates, z, ts, w_rec, w_out)
    n = d_pre.shape[0] * d_pre.shape[1]
    dg = d_gates.view(n, 4 * d)
    d_w_rec = d_pre.view(n, -1).t() @ h_prev.reshape(n, d)  # (U, D)
    d_w_out = dg.t() @ z.reshape(n, -1)  # (4D, U)
    d_b_out = dg.sum(dim=0)
    d_ts = (d_gates[..., 3 * d :] * gates[..., 2 * d : 3 * d]).sum(dim=-1)  # ∂(ta·ts + tb)/∂ts = ta
    return d_pre, d_ts, d_h0, d_w_rec, d_w_out, d_b_out


torch.library.register_autograd("perception::cfc_scan", _backward, setup_context=_setup)
