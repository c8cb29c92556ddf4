"""trainer.precision, the study's numeric setting, one for training and evaluation alike:

    fp32  IEEE fp32 everywhere (TF32 off)
    tf32  fp32 storage, TF32 tensor-core matmuls on CUDA: the default, and what CUDA runs did before the
          setting existed; on CPU identical to fp32
    bf16  autocast to bfloat16 around the forward pass: the trunk's (VSN, Mamba2) matmuls and glue in
          bf16; the pools, the CfC scan and the heads run in fp32 (PerceptionModel), as do parameters,
          optimizer state and the loss

The gate refuses arms trained at different precisions (a run without the param counts as fp32)."""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import TYPE_CHECKING

from perception.enums import enum_value

if TYPE_CHECKING:  # torch loads with the trainer: the config that names a precision does not need it
    import torch


class Precision(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"


def configure(precision: Precision | str, device: torch.device) -> None:
    """Process-wide matmul flags for the run's precision (bf16 keeps TF32 for what autocast leaves fp32)."""
    if device.type == "cuda":
        import torch

        tf32 = enum_value(precision) != Precision.fp32.value
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def forward_context(precision: Precision | str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context a forward pass runs in: bf16 autocast for bf16, nothing otherwise."""
    if enum_value(precision) == Precision.bf16.value:
        import torch

        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
