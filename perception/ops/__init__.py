"""Hot ops of the model, one module per op family: `pool` (attention pool, inverted pool, their merge) and
`cfc` (the CfC scan), each holding its public ops, their references `<op>_ref`, and the fakes and autograd
of its kernels; `common` holds what the families share. Public ops dispatch on `backend`
(model.ops = auto | ref | cuda): auto takes the CUDA kernels for CUDA tensors when the extension loads,
else the references."""

from __future__ import annotations

from perception.ops.cfc import cfc_scan, cfc_scan_ref
from perception.ops.common import KERNEL_WIDTHS
from perception.ops.common import use_kernels as use_kernels
from perception.ops.pool import (
    attention_pool,
    attention_pool_ref,
    attention_weights_ref,
    inv_pool_merge,
    inv_pool_merge_ref,
    inverted_pool,
    inverted_pool_ref,
)

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
