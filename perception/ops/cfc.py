"""The CfC family, `cfc_scan` (schema in csrc/cfc.cpp).

Top to bottom: the public op, which takes the kernel or the reference by `backend`; its pure-PyTorch
reference `cfc_scan_ref` over one step `cfc_cell_ref` (the kernels' oracle and the CPU path, written as the
equations of DESIGN §3, with autograd for its backward); the fakes of the kernel's forward and backward ops;
the kernel's autograd. `register()` at the end attaches fakes and autograd to the schemas, which exist only
once `perception.ops.extension` has loaded the library, so it is the one that calls it.

The forward saves only its inputs and h_seq; the backward recomputes z and the gate pre-activations for all
steps with two GEMMs (they do not depend on the backward recurrence), runs the backward-through-time kernel,
and forms the weight gradients as GEMMs over the per-step gradients it wrote: one fixed-order reduction per
weight, no atomics.

Backward workspace at B=64, K=6000, D=128 (fp32): h_prev, z, d_pre 197 MB each; gates, d_gates 786 MB
each: 2.2 GB, freed when the backward returns. The forward keeps nothing beyond h_seq.

The fakes are exact: they check what the kernels' entry points check and return the kernels' (contiguous)
outputs."""

from __future__ import annotations

import torch
from torch.library import register_autograd, register_fake

from perception.ops.common import KERNEL_WIDTHS, check_fp32, check_shape, check_width, upcast, use_kernels


def _cfc_kernel_takes(backend: str, x_proj: torch.Tensor, h0: torch.Tensor, *weights: torch.Tensor) -> bool:
    """The scan kernels take fp32 with D = U in KERNEL_WIDTHS. `auto` falls back to the reference where the
    answer is no; `cuda` always answers yes, so the kernel's own check names what it expected."""
    if getattr(backend, "value", backend) == "cuda":
        return True
    fp32 = all(t.dtype == torch.float32 for t in (x_proj, h0, *weights))
    return fp32 and h0.shape[-1] in KERNEL_WIDTHS and x_proj.shape[-1] == h0.shape[-1]


def cfc_scan(
    x_proj: torch.Tensor,
    ts: torch.Tensor,
    h0: torch.Tensor,
    w_rec: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """x_proj: (B, K, U), ts: (B, K), h0: (B, D), w_rec: (U, D), w_out: (4D, U), b_out: (4D,)
    -> h_seq: (B, K, D)."""
    if use_kernels(backend, x_proj, ts, h0, w_rec, w_out, b_out) and _cfc_kernel_takes(
        backend, x_proj, h0, ts, w_rec, w_out, b_out
    ):
        return torch.ops.perception.cfc_scan(x_proj, ts, h0, w_rec, w_out, b_out)
    return cfc_scan_ref(x_proj, ts, h0, w_rec, w_out, b_out)


# ------------------------------------------------------------- reference ---------------------------


def lecun_tanh(x: torch.Tensor) -> torch.Tensor:
    return 1.7159 * torch.tanh(0.666 * x)


def cfc_cell_ref(
    x_proj_t: torch.Tensor,
    ts_t: torch.Tensor,
    h: torch.Tensor,
    w_rec: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
) -> torch.Tensor:
    """One CfC step. x_proj_t: (B, U), ts_t: (B,), h: (B, D), w_rec: (U, D), w_out: (4D, U),
    b_out: (4D,) -> h': (B, D)."""
    z = lecun_tanh(x_proj_t + h @ w_rec.t())  # (B, U)
    f1, f2, ta, tb = (z @ w_out.t() + b_out).chunk(4, dim=-1)  # 4 x (B, D)
    sigma = torch.sigmoid(ta * ts_t.unsqueeze(-1) + tb)  # time span scales per sample, across D
    return torch.tanh(f1) * (1.0 - sigma) + sigma * torch.tanh(f2)


def cfc_scan_ref(
    x_proj: torch.Tensor,
    ts: torch.Tensor,
    h0: torch.Tensor,
    w_rec: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
) -> torch.Tensor:
    """x_proj: (B, K, U), ts: (B, K), h0: (B, D), w_rec: (U, D), w_out: (4D, U), b_out: (4D,)
    -> h_seq: (B, K, D). The one Python time loop the model allows."""
    x_proj, ts, h = upcast(x_proj), upcast(ts), upcast(h0)
    w_rec, w_out, b_out = upcast(w_rec), upcast(w_out), upcast(b_out)
    hs = []
    for t in range(x_proj.shape[1]):
        h = cfc_cell_ref(x_proj[:, t], ts[:, t], h, w_rec, w_out, b_out)
        hs.append(h)
    return torch.stack(hs, dim=1)


# ------------------------------------------------------------- fakes -------------------------------


def _check_scan_operands(
    op: str, lead_name: str, layout: str, lead: torch.Tensor, **operands: torch.Tensor
) -> tuple[int, int, int]:
    """What the scan kernels' entry points check: `lead` 3-d (`layout`, its sizes B, K, D), every operand
    fp32, each other one of its shape at that B, K and D (the kernels take U = D), D a kernel width.
    Returns (B, K, D)."""
    torch._check(lead.dim() == 3, lambda: f"{op}: {lead_name} must be {layout}, got {list(lead.shape)}")
    b, k, d = lead.shape
    check_fp32(op, **{lead_name: lead}, **operands)
    shapes = {
        "ts": (b, k),
        "h0": (b, d),
        "w_rec": (d, d),
        "w_out": (4 * d, d),
        "b_out": (4 * d,),
        "gates": (b, k, 4 * d),
        "z": (b, k, d),
    }
    for name, t in operands.items():
        check_shape(op, name, t, shapes[name])
    check_width(op, d, KERNEL_WIDTHS)
    return b, k, d


def _cfc_scan_fake(x_proj, ts, h0, w_rec, w_out, b_out):
    b, k, d = _check_scan_operands(
        "cfc_scan", "x_proj", "(B, K, U)", x_proj, ts=ts, h0=h0, w_rec=w_rec, w_out=w_out, b_out=b_out
    )
    return x_proj.new_empty((b, k, d))


def _cfc_scan_bwd_fake(grad_h, gates, z, ts, w_rec, w_out):
    b, k, d = _check_scan_operands(
        "cfc_scan_bwd", "grad_h", "(B, K, D)", grad_h, gates=gates, z=z, ts=ts, w_rec=w_rec, w_out=w_out
    )
    return grad_h.new_empty((b, k, d)), grad_h.new_empty((b, k, 4 * d)), grad_h.new_empty((b, d))


# ------------------------------------------------------------- autograd ----------------------------


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
    d_b_out = dg.t().mv(dg.new_ones(n))  # (4D,): d_gates summed over every step as one GEMV
    d_ts = (d_gates[..., 3 * d :] * gates[..., 2 * d : 3 * d]).sum(dim=-1)  # ∂(ta·ts + tb)/∂ts = ta
    return d_pre, d_ts, d_h0, d_w_rec, d_w_out, d_b_out


# ------------------------------------------------------------- registration ------------------------


def register() -> None:
    """Fakes and autograd of the CfC family's kernels; needs their schemas, so the loaded library."""
    register_fake("perception::cfc_scan", _cfc_scan_fake)
    register_fake("perception::cfc_scan_bwd", _cfc_scan_bwd_fake)
    register_autograd("perception::cfc_scan", _backward, setup_context=_setup)
