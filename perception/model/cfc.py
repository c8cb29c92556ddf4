"""Closed-form continuous-time recurrence (CfC, "default" mode; DESIGN §3), re-implemented because
`ncps` is unmaintained and mishandles per-sample time spans. U = D units."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from perception import ops
from perception.model.init import uniform_, xavier_


class CfC(nn.Module):
    def __init__(self, d_model: int, backend: str):
        super().__init__()
        d = u = d_model
        self.w_in = nn.Parameter(torch.empty(u, d))
        self.b_in = nn.Parameter(torch.empty(u))
        self.w_rec = nn.Parameter(torch.empty(u, d))
        self.w_out = nn.Parameter(torch.empty(4 * d, u))  # -> [f1, f2, ta, tb]
        self.b_out = nn.Parameter(torch.empty(4 * d))
        self.backend = backend

    def reset_parameters(self, gen: torch.Generator) -> None:
        xavier_(self.w_in, gen)
        xavier_(self.w_rec, gen)
        xavier_(self.w_out, gen)
        uniform_(self.b_in, 0.0, gen)
        uniform_(self.b_out, 0.0, gen)

    def forward(self, lnb: torch.Tensor, ts: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        """lnb: (B, K, D), ts: (B, K) time spans, h0: (B, D) -> h_seq: (B, K, D)."""
        x_proj = F.linear(lnb, self.w_in, self.b_in)  # (B, K, U): one GEMM for every step
        return ops.cfc_scan(x_proj, ts, h0, self.w_rec, self.w_out, self.b_out, backend=self.backend)
