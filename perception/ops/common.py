"""What every op family shares, as csrc/common.cuh is for the kernels: the widths the kernels are compiled
for, the choice between kernel and reference, the references' upcast, and the argument checks of the
kernels' entry points that the fakes repeat."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from perception.enums import enum_value
from perception.ops import extension

KERNEL_WIDTHS = (16, 32, 64, 128)  # hidden widths D every kernel family is compiled for (csrc/common.cuh)


def use_kernels(backend: str, *tensors: torch.Tensor) -> bool:
    """model.ops: `ref` never takes the kernels, `cuda` always (or says why it cannot), `auto` for CUDA
    tensors when the extension loads. Each family then asks whether its kernel takes the input."""
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


def upcast(t: torch.Tensor) -> torch.Tensor:
    """The references compute half inputs in fp32; fp64 stays fp64, for gradcheck."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# The fakes' checks: a fake that accepts what the kernel rejects would let torch.compile trace a program
# that fails only when it runs. Each check is a `torch._check`, so symbolic shapes become guards or runtime
# asserts instead of errors at trace time.


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
