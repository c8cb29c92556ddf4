"""The argument checks of the kernels' entry points, for the fake (meta) implementations: a fake that accepts
what the kernel rejects would let torch.compile trace a program that fails only when it runs. Each check is
a `torch._check`, so symbolic shapes become guards or runtime asserts instead of errors at trace time."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_fp32(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        torch._check(t.dtype == torch.float32, lambda n=name, t=t: f"{op}: {n} must be float32, got {t.dtype}")


def check_shape(op: str, name: str, t: torch.Tensor, shape: Sequence) -> None:
    """t has exactly `shape` (ints or symbolic sizes)."""
    torch._check(t.dim() == len(shape), lambda: f"{op}: {name} must have {len(shape)} dims, got {t.dim()}")
    for got, want in zip(t.shape, shape):
        torch._check(got == want, lambda: f"{op}: {name} must have shape {list(shape)}, got {list(t.shape)}")


def check_width(op: str, d, widths: Sequence[int]) -> None:
    listed = "{" + ", ".join(str(w) for w in widths) + "}"
    torch._check(d in widths, lambda: f"{op}: kernels take D in {listed}, got D = {d} (use model.ops=ref)")
