"""Per-module seeded initialisation: each module draws from its own generator seeded by
(seed, module name), so a module's start does not depend on what was built before it and the
common trunk starts identical in both variants."""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn


def module_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded by a stable hash of (seed, name) (crc32: stable across processes)."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{int(seed)}:{name}".encode()))
    return g


def uniform_(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    """In-place U(-bound, bound) drawn on the CPU, so the draw is the same on every device."""
    with torch.no_grad():
        t.copy_(torch.empty(t.shape, dtype=t.dtype).uniform_(-bound, bound, generator=gen))


def normal_(t: torch.Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(torch.empty(t.shape, dtype=t.dtype).normal_(0.0, std, generator=gen))


def init_linear(layer: nn.Linear, gen: torch.Generator) -> None:
    """torch's default Linear init (U(±1/sqrt(fan_in)) for weight and bias), from `gen`."""
    bound = 1.0 / math.sqrt(layer.in_features)
    uniform_(layer.weight, bound, gen)
    if layer.bias is not None:
        uniform_(layer.bias, bound, gen)


def xavier_(t: torch.Tensor, gen: torch.Generator) -> None:
    fan_out, fan_in = t.shape[-2], t.shape[-1]
    uniform_(t, math.sqrt(6.0 / (fan_in + fan_out)), gen)
