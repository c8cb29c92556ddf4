"""Output heads (DESIGN §3). SharedQuery: logit_h = w_h . h_K + b_h, weight [H, D].
PerHorizon Path A: logit_h = w_h . [(1 - α) ctx_h ‖ α h_K] + b_h, weight [H, 2D]. With one query
(the shared-context ablation) every horizon reads that one context."""

from __future__ import annotations

import math

import torch
from torch import nn

from perception.model.init import uniform_


class Heads(nn.Module):
    def __init__(self, n_horizons: int, d_model: int, path_a: bool, aux_weight: float):
        super().__init__()
        self.path_a, self.alpha, self.d_model = path_a, aux_weight, d_model
        width = 2 * d_model if path_a else d_model
        self.weight = nn.Parameter(torch.empty(n_horizons, width))
        self.bias = nn.Parameter(torch.empty(n_horizons))

    def reset_parameters(self, gen: torch.Generator) -> None:
        bound = 1.0 / math.sqrt(self.weight.shape[1])
        uniform_(self.weight, bound, gen)
        uniform_(self.bias, bound, gen)

    def forward(self, h_last: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """h_last: (B, D), ctx: (B, Q, D) -> logits: (B, H)."""
        if not self.path_a:
            return h_last @ self.weight.t() + self.bias
        ctx = ctx.expand(-1, self.weight.shape[0], -1)  # (B, H, D); a no-op unless Q = 1
        w_ctx, w_h = self.weight[:, : self.d_model], self.weight[:, self.d_model :]  # (H, D) each
        from_ctx = torch.einsum("bhd,hd->bh", ctx, w_ctx)  # each horizon reads its own query's context
        return (1.0 - self.alpha) * from_ctx + self.alpha * (h_last @ w_h.t()) + self.bias
