"""Pure-PyTorch reference ops: the oracle for the CUDA kernels and the CPU path.

Each reference upcasts half inputs to fp32 (fp64 stays fp64, for gradcheck) and is written as the
equations of DESIGN §3, with autograd providing the backward."""

from __future__ import annotations

import math

import torch


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def attention_weights_ref(lnb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> a: (B, Q, K), softmax over K of s = q . lnb (no extra scale)."""
    lnb, q = _upcast(lnb), _upcast(q)
    s = torch.einsum("qd,bkd->bqk", q, lnb)  # (B, Q, K)
    return torch.softmax(s, dim=-1)


def attention_pool_ref(lnb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D), q: (Q, D) -> ctx: (B, Q, D) = softmax_k(q . lnb) @ lnb."""
    a = attention_weights_ref(lnb, q)  # (B, Q, K)
    return torch.einsum("bqk,bkd->bqd", a, _upcast(lnb))


def inverted_pool_ref(lnb: torch.Tensor) -> torch.Tensor:
    """lnb: (B, K, D) -> inv: (B, D). Cross-variate attention: each hidden channel h attends over
    channels j with s[h, j] = K^-1/2 sum_k X[h, k] X[j, k] and pools the channels' time means."""
    x = _upcast(lnb).transpose(1, 2)  # (B, D, K)
    k = x.shape[-1]
    s = torch.matmul(x, x.transpose(1, 2)) / math.sqrt(k)  # (B, D, D)
    a = torch.softmax(s, dim=-1)
    m = x.mean(dim=-1)  # (B, D)
    return torch.matmul(a, m.unsqueeze(-1)).squeeze(-1)  # (B, D)


def inv_pool_merge_ref(ctx: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """ctx: (B, Q, D), inv: (B, D) -> ctx + inv broadcast over every query."""
    return _upcast(ctx) + _upcast(inv).unsqueeze(1)


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
    x_proj, ts, h = _upcast(x_proj), _upcast(ts), _upcast(h0)
    w_rec, w_out, b_out = _upcast(w_rec), _upcast(w_out), _upcast(b_out)
    hs = []
    for t in range(x_proj.shape[1]):
        h = cfc_cell_ref(x_proj[:, t], ts[:, t], h, w_rec, w_out, b_out)
        hs.append(h)
    return torch.stack(hs, dim=1)


__all__ = [
    "attention_weights_ref",
    "attention_pool_ref",
    "inverted_pool_ref",
    "inv_pool_merge_ref",
    "cfc_scan_ref",
    "cfc_cell_ref",
    "lecun_tanh",
]
