"""Mamba2 in pure PyTorch (DESIGN §3): pre-norm residual blocks around a mixer whose scan is the
chunked SSD ("state space duality") form; `ssd_scan_sequential` is the recurrence it must equal.

Shapes: b batch, K time, h heads, p headdim, n d_state, c chunks, l = s = chunk length."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perception.enums import as_enum
from perception.errors import ConfigError
from perception.model.compiled import inductor_options
from perception.model.config import SSDBackend
from perception.model.init import init_linear, uniform_
from perception.model.ssd_fla import require_fla, ssd_scan_fla
from perception.model.ssd_mamba import require_mamba, ssd_scan_mamba


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a: (..., T) -> (..., T, T) with out[i, j] = sum_{j < m <= i} a[m] for j <= i, -inf above.
    Summing masked copies (not differencing a cumsum) keeps long decays exact in fp32."""
    t = a.shape[-1]
    ones = torch.ones(t, t, dtype=torch.bool, device=a.device)
    rows = a.unsqueeze(-1).expand(*a.shape, t)  # rows[..., m, j] = a[m]
    seg = rows.masked_fill(~ones.tril(-1), 0.0).cumsum(dim=-2)
    return seg.masked_fill(~ones.tril(0), -math.inf)


def within_chunk_decay(Adt: torch.Tensor, cs: torch.Tensor, from_cumsum: bool) -> torch.Tensor:
    """(b, h, c, l) -> (b, h, c, l, s): exp of the decay from step s to step l of a chunk, 0 above the diagonal.
    `from_cumsum`: exp(cs_l - cs_s) from the chunk's own cumulative sum, as Mamba2's and fla's kernels form
    it; a pointwise op of two small tensors that Inductor fuses into the scores product (the masked-copy
    sums are a scan over (l, s) blocks), exact to about |cs| 2^-23 in the exponent."""
    if not from_cumsum:
        return torch.exp(segment_sums(Adt))
    t = cs.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=cs.device).tril()
    return torch.exp(
        (cs.unsqueeze(-1) - cs.unsqueeze(-2)).masked_fill(~causal, -math.inf)
    )  # -inf before exp: no inf * 0 in backward


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    chunk: int,
    decay_from_cumsum: bool = False,
) -> torch.Tensor:
    """Chunked SSD. x: (b, K, h, p), dt: (b, K, h), A: (h,), B, C: (b, K, n), D: (h,)
    -> y: (b, K, h, p). The tail is padded with A·dt = 0 and X = 0, which leaves y[:K] unchanged.
    `decay_from_cumsum`: see `within_chunk_decay` (the compiled blocks' form)."""
    b, k, h, p = x.shape
    pad = (-k) % chunk
    X = F.pad(x * dt.unsqueeze(-1), (0, 0, 0, 0, 0, pad))  # (b, Kp, h, p)
    Adt = F.pad(dt * A, (0, 0, 0, pad))  # (b, Kp, h)
    Bc = F.pad(B, (0, 0, 0, pad))
    Cc = F.pad(C, (0, 0, 0, pad))
    c = (k + pad) // chunk
    X = X.view(b, c, chunk, h, p).permute(0, 3, 1, 2, 4)  # (b, h, c, l, p)
    Adt = Adt.view(b, c, chunk, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    Bc = Bc.view(b, c, chunk, -1)  # (b, c, l, n), one group shared by all heads
    Cc = Cc.view(b, c, chunk, -1)
    cs = Adt.cumsum(dim=-1)  # (b, h, c, l)

    # within each chunk: y_i = sum_{j <= i} (C_i . B_j) exp(A-decay j -> i) X_j
    decay = within_chunk_decay(Adt, cs, decay_from_cumsum)  # (b, h, c, l, s)
    scores = torch.einsum("bcln,bcsn->bcls", Cc, Bc)  # (b, c, l, s)
    y = torch.einsum("bhcls,bhcsp->bhclp", decay * scores.unsqueeze(1), X)

    # each chunk's own contribution to the state at its end
    to_end = torch.exp(cs[..., -1:] - cs)  # (b, h, c, l)
    states = torch.einsum("bhclp,bcln->bhcpn", X * to_end.unsqueeze(-1), Bc)  # (b, h, c, p, n)

    # states entering each chunk: a (c+1)-step recurrence written as one decay matrix
    states = torch.cat([torch.zeros_like(states[:, :, :1]), states], dim=2)  # (b, h, c+1, p, n)
    chunk_decay = torch.exp(segment_sums(F.pad(cs[..., -1], (1, 0))))  # (b, h, c+1, c+1)
    entering = torch.einsum("bhij,bhjpn->bhipn", chunk_decay, states)[:, :, :-1]  # (b, h, c, p, n)
    y = y + torch.einsum("bcln,bhcpn->bhclp", Cc, entering) * torch.exp(cs).unsqueeze(-1)

    y = y.permute(0, 2, 3, 1, 4).reshape(b, c * chunk, h, p)[:, :k]  # (b, K, h, p)
    return y + D.view(1, 1, h, 1) * x


def ssd_scan_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
) -> torch.Tensor:
    """The oracle: H_t = exp(dt_t A) H_{t-1} + dt_t x_t ⊗ B_t, y_t = C_t . H_t + D x_t.
    Same shapes as `ssd_scan`; a time loop, for tests only."""
    b, k, h, p = x.shape
    state = x.new_zeros(b, h, p, B.shape[-1])  # (b, h, p, n)
    ys = []
    for t in range(k):
        a = torch.exp(dt[:, t] * A).view(b, h, 1, 1)
        inp = (dt[:, t].unsqueeze(-1) * x[:, t]).unsqueeze(-1) * B[:, t].view(b, 1, 1, -1)
        state = a * state + inp
        ys.append(torch.einsum("bhpn,bn->bhp", state, C[:, t]) + D.view(1, h, 1) * x[:, t])
    return torch.stack(ys, dim=1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in the weight's dtype, returned in x's. Under bf16 autocast x is bf16 and the
    weight fp32: ATen then warns and falls back to an unfused upcast-normalise-scale; upcasting first computes
    the same in its fused kernel."""
    return F.rms_norm(x.to(weight.dtype), x.shape[-1:], weight, eps).to(x.dtype)


def causal_conv(xbc: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """xbc: (B, K, C) -> (B, K, C): the causal depthwise convolution as ATen's conv1d over (B, C, K)."""
    return conv(xbc.transpose(1, 2))[..., : xbc.shape[1]].transpose(1, 2)


def causal_conv_shifted(xbc: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """The same convolution as d_conv shifted multiply-adds in (B, K, C): compiled, Inductor fuses it with
    the split, SiLU and SSD prologue around it, where ATen's depthwise kernels stay separate passes.
    y[b, t, c] = bias[c] + sum_j w[c, j] x[b, t - d + 1 + j, c]; weights in x's dtype, as conv1d under autocast."""
    return _shifted(xbc, conv.weight[:, 0], conv.bias)


def _shifted(xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`causal_conv_shifted` with the depthwise weight (C, d) and bias (C,) given."""
    k, d = xbc.shape[1], weight.shape[1]
    w, bias = weight.to(xbc.dtype), bias.to(xbc.dtype)  # (C, d), (C,)
    padded = F.pad(xbc, (0, 0, d - 1, 0))  # (B, K + d - 1, C), zeros before t = 0
    out = bias + padded[:, :k] * w[:, 0]
    for j in range(1, d):
        out = out + padded[:, j : j + k] * w[:, j]
    return out


def conv_silu_split(xbc: torch.Tensor, conv: nn.Conv1d, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """SiLU(causal_conv(xbc)) split into x, B, C (views of one (B, K, C) tensor): eager's form."""
    return F.silu(causal_conv(xbc, conv)).split(sizes, dim=-1)


def conv_silu_split_shifted(xbc: torch.Tensor, conv: nn.Conv1d, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """The same, each part convolved on its own in the shifted form (the compiled blocks'): each part is then
    its own contiguous buffer, which the SSD kernels read as it is, where a view of one buffer is copied to a
    contiguous one in their forward and again in their backward."""
    weights, biases = conv.weight[:, 0].split(sizes), conv.bias.split(sizes)
    parts = xbc.split(sizes, dim=-1)
    return tuple(F.silu(_shifted(part, w, b)) for part, w, b in zip(parts, weights, biases))


class Mamba2Mixer(nn.Module):
    """in_proj -> [z, xBC, dt]; causal depthwise conv + SiLU on xBC; SSD; gated RMSNorm; out_proj."""

    def __init__(
        self, d_model: int, d_state: int, headdim: int, expand: int, d_conv: int, chunk: int, ssd: str = "chunked"
    ):
        super().__init__()
        self.ssd = as_enum(SSDBackend, ssd, "model.mamba.ssd")
        if self.ssd is SSDBackend.fla:
            require_fla()
        if self.ssd is SSDBackend.mamba:
            require_mamba()
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ConfigError(f"model.mamba.headdim={headdim} must divide expand * d_model = {d_inner}")
        if chunk < 1 or d_conv < 1:
            raise ConfigError(f"model.mamba.chunk={chunk} and d_conv={d_conv} must be >= 1")
        self.d_inner, self.d_state, self.headdim, self.chunk = d_inner, d_state, headdim, chunk
        self.n_heads = d_inner // headdim
        conv_dim = d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, d_inner + conv_dim + self.n_heads, bias=False)
        self.conv = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1)
        self.dt_bias = nn.Parameter(torch.empty(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm_weight = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        self._conv_silu_split = conv_silu_split
        self._decay_from_cumsum = False

    def reset_parameters(self, gen: torch.Generator) -> None:
        """As the reference Mamba2: dt log-uniform in [1e-3, 0.1] (through an inverse softplus),
        A uniform in [1, 16], D = 1."""
        init_linear(self.in_proj, gen)
        init_linear(self.out_proj, gen)
        bound = 1.0 / math.sqrt(self.conv.kernel_size[0])  # depthwise: fan_in = kernel size
        uniform_(self.conv.weight, bound, gen)
        uniform_(self.conv.bias, bound, gen)
        with torch.no_grad():
            u = torch.rand(self.n_heads, generator=gen, dtype=self.dt_bias.dtype)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            a = torch.empty(self.n_heads, dtype=self.A_log.dtype).uniform_(1.0, 16.0, generator=gen)
            self.A_log.copy_(torch.log(a))
            self.D.fill_(1.0)
            self.norm_weight.fill_(1.0)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, K, D) -> (B, K, D)."""
        b, k, _ = u.shape
        z, xbc, dt = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * self.d_state, self.n_heads], dim=-1)
        x, B, C = self._conv_silu_split(xbc, self.conv, [self.d_inner, self.d_state, self.d_state])
        dt = F.softplus(dt + self.dt_bias)  # (B, K, heads)
        A = -torch.exp(self.A_log)  # (heads,)
        x = x.reshape(b, k, self.n_heads, self.headdim)
        if self.ssd is SSDBackend.fla:
            y = ssd_scan_fla(x, dt, A, B, C, self.D)
        elif self.ssd is SSDBackend.mamba:
            y = ssd_scan_mamba(x, dt, A, B, C, self.D, self.chunk)
        else:
            y = ssd_scan(x, dt, A, B, C, self.D, self.chunk, self._decay_from_cumsum)
        y = y.reshape(b, k, self.d_inner) * F.silu(z)
        y = rms_norm(y, self.norm_weight, eps=1e-5)
        return self.out_proj(y)


class Mamba2Block(nn.Module):
    def __init__(self, d_model: int, **mixer_kwargs):
        super().__init__()
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.mixer = Mamba2Mixer(d_model, **mixer_kwargs)

    def reset_parameters(self, gen: torch.Generator) -> None:
        self.norm.reset_parameters()
        self.mixer.reset_parameters(gen)

    def compile_fused(self) -> None:
        """torch.compile (static shapes, in place: parameter names unchanged) with the convolution in its
        shifted form, a part (x, B, C) at a time, and the SSD's within-chunk decay from the cumulative sum, all of
        which Inductor fuses.
        Without Inductor's padding of matmul dimensions to multiples of 8: padding the (c + 1)-chunk
        recurrence's bmm copies its (b h, c + 1, p n) states each step, which costs more than the padded bmm
        saves (benchmarks/results/mamba_ssd_h200.md; benchmarks/trunk_forms.py ssd measures the other choices)."""
        self.mixer._conv_silu_split = conv_silu_split_shifted
        self.mixer._decay_from_cumsum = True
        self.compile(dynamic=False, options=inductor_options(shape_padding=False))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u + self.mixer(rms_norm(u, self.norm.weight, self.norm.eps))


class Mamba2(nn.Module):
    """L pre-norm residual Mamba2 blocks: (B, K, D) -> (B, K, D)."""

    def __init__(
        self,
        d_model: int,
        n_layers: int,
        d_state: int,
        headdim: int,
        expand: int,
        d_conv: int,
        chunk: int,
        ssd: str = "chunked",
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            Mamba2Block(d_model, d_state=d_state, headdim=headdim, expand=expand, d_conv=d_conv, chunk=chunk, ssd=ssd)
            for _ in range(n_layers)
        )

    def reset_parameters(self, gen: torch.Generator) -> None:
        for layer in self.layers:
            layer.reset_parameters(gen)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            u = layer(u)
        return u
