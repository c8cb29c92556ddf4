"""Hot ops of the model. Public ops dispatch on `backend` (model.ops = auto | ref | cuda):
auto takes the CUDA kernels for CUDA tensors when the extension loads, else the references."""

from __future__ import annotations

import torch

from perception.enums import enum_value
from perception.ops import extension
from perception.ops.reference import (
    attention_pool_ref,
    attention_weights_ref,
    cfc_scan_ref,
    inv_pool_merge_ref,
    inverted_pool_ref,
)


def use_kernels(backend: str, *tensors: torch.Tensor) -> bool:
    backend = enum_value(backend)
    if backend == "ref":
        return False
    if backend == "cuda":
        extension.require()
        if not all(t.is_cuda for t in tensors):
            raise ValueError("model.ops=cuda needs CUDA tensors; got a CPU tensor (set trainer.device=cuda)")
        return True
    if backend == "auto":
        return all(t.is_cuda for t in tensors) and extension.available()
    raise ValueError(f"model.ops={backend!r}: expected one of auto, ref, cuda")


KERNEL_WIDTHS = (16, 32, 64, 128)  # hidden widths D every kernel family is compiled for (csrc/common.cuh)


# "Can the kernel take this?", one check per family. `auto` falls back to the references where the answer is
# no; `cuda` always answers yes, so the kernel's own check names what it expected.


def _pool_kernel_takes(backend: str, *tensors: torch.Tensor) -> bool:
    """Pool kernels take fp32 with D (the first tensor's last dim) in KERNEL_WIDTHS."""
    if getattr(backend, "value", backend) == "cuda":
        return True
    return all(t.dtype == torch.float32 for t in tensors) and tensors[0].shape[-1] in KERNEL_WIDTHS


def _cfc_kernel_takes(backend: str, x_proj: torch.Tensor, h0: torch.Tensor, *weights: torch.Tensor) -> bool:
    """The scan kernels take fp32 with D = U in KERNEL_WIDTHS."""
    if getattr(backend, "value", backend) == "cuda":
        return True
    fp32 = all(t.dtype == torch.float32 for t in (x_proj, h0, *weights))
    return fp32 and h0.shape[-1] in KERNEL_WIDTHS and x_proj.shape[-1] == h0.shape[-1]


def attention_pool(lnb: torch.Tensor, q: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> ctx: (B, Q, D)."""
    if use_kernels(backend, lnb, q) and _pool_kernel_takes(backend, lnb, q):
        return torch.ops.perception.attention_pool(lnb, q)[
            0
        ]  # [1:] are softmax statistics and scores kept for backward
    return attention_pool_ref(lnb, q)


def inverted_pool(lnb: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """lnb: (B, K, D) -> inv: (B, D)."""
    if use_kernels(backend, lnb) and _pool_kernel_takes(backend, lnb):
        return torch.ops.perception.inverted_pool(lnb)[0]  # [1:] are attention and means kept for backward
    return inverted_pool_ref(lnb)


def inv_pool_merge(ctx: torch.Tensor, inv: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """ctx: (B, Q, D), inv: (B, D) -> ctx: (B, Q, D)."""
    if use_kernels(backend, ctx, inv) and _pool_kernel_takes(backend, ctx, inv):
        return torch.ops.perception.inv_pool_merge(ctx, inv)
    return inv_pool_merge_ref(ctx, inv)


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


__all__ = [
    "KERNEL_WIDTHS",
    "attention_pool",
    "attention_pool_ref",
    "attention_weights_ref",
    "inverted_pool",
    "inverted_pool_ref",
    "inv_pool_merge",
    "inv_pool_merge_ref",
    "cfc_scan",
    "cfc_scan_ref",
]
