"""The attention pool's query and the inverted (cross-variate) pool, both calling the public ops,
so the CUDA kernels replace the references without touching the model."""

from __future__ import annotations

import math

import torch
from torch import nn

from perception import ops
from perception.model.init import normal_


class AttentionPool(nn.Module):
    """Q learned queries over LNb: Q = 1 (SharedQuery) or Q = H (PerHorizon). The query tensor is
    named `q` (shared) or `q_h` (per-horizon), the names checkpoints carry (DESIGN §6)."""

    def __init__(self, n_queries: int, d_model: int, per_horizon: bool, backend: str):
        super().__init__()
        self.query_name = "q_h" if per_horizon else "q"
        self.register_parameter(self.query_name, nn.Parameter(torch.empty(n_queries, d_model)))
        self.backend = backend

    @property
    def query(self) -> torch.Tensor:
        return getattr(self, self.query_name)

    def reset_parameters(self, gen: torch.Generator) -> None:
        normal_(self.query, 1.0 / math.sqrt(self.query.shape[-1]), gen)  # N(0, 1/D)

    def forward(self, lnb: torch.Tensor) -> torch.Tensor:
        """lnb: (B, K, D) -> ctx: (B, Q, D)."""
        return ops.attention_pool(lnb, self.query, backend=self.backend)

    def weights(self, lnb: torch.Tensor) -> torch.Tensor:
        """lnb: (B, K, D) -> a: (B, Q, K), for diagnostics."""
        return ops.attention_weights_ref(lnb, self.query)


class InvertedPool(nn.Module):
    """lnb: (B, K, D) -> inv: (B, D). A module (no parameters) so its output can be hooked."""

    def __init__(self, backend: str):
        super().__init__()
        self.backend = backend

    def forward(self, lnb: torch.Tensor) -> torch.Tensor:
        return ops.inverted_pool(lnb, backend=self.backend)
