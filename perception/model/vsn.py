"""Memory-aware variable selection network (TFT-style, DESIGN §3).

Every scalar feature j gets its own width-d_v embedding and GRN, batched over variables with
grouped weights [F, ...] (a batched GEMM per layer, or one block-diagonal GEMM when compiled; no loop
over features). A TFT VSN at width D would hold [B, K, F, D] tensors (9 GB each at production size); at
d_v = 8 they are D/d_v times smaller."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perception.model.compiled import inductor_options
from perception.ops.grn import grn_select
from perception.model.init import init_linear, uniform_


def grouped_linear(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: (..., F, i), w: (F, o, i), b: (F, o) -> (..., F, o): one Linear(i -> o) per variable as a batched
    GEMM over F (eager's form: the fewest FLOPs)."""
    return torch.einsum("...fi,foi->...fo", a, w) + b


def grouped_linear_block_diag(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same as `grouped_linear` as one dense GEMM, (..., F·i) @ block_diag(w)ᵀ (the compiled form): F
    times the FLOPs, but on tensor cores and with no permutes around a batched GEMM of inner size d_v = 8,
    which makes the VSN faster at both compiled precisions (docs/performance.md "The compiled trunk: what
    was kept"; benchmarks/trunk_forms.py fusion)."""
    f, o, _ = w.shape
    dense = torch.block_diag(*w.unbind(0))  # (F·o, F·i)
    return (a.flatten(-2) @ dense.t()).unflatten(-1, (f, o)) + b


def fold_embedding(
    w: torch.Tensor, b: torch.Tensor, embed_w: torch.Tensor, embed_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear(F·d_v -> o) (w: (o, F·d_v), b: (o,)) of the embedding x·embed_w + embed_b (`embed`) as a
    Linear(F -> o) of x itself, exactly: w·(x ⊗ embed_w + embed_b) + b = (w ⊙ embed_w)·x + (w·embed_b + b)."""
    f, d = embed_w.shape
    folded = (w.unflatten(-1, (f, d)) * embed_w).sum(-1)  # (o, F)
    return folded, w @ embed_b.flatten() + b


class GroupedGRN(nn.Module):
    """F independent GRNs of width d (input = hidden = output = d), weights stacked over F.
    GRN(a) = LayerNorm(a + GLU(fc2(ELU(fc1(a)))))."""

    def __init__(self, n_vars: int, d: int):
        super().__init__()
        self.fc1_w = nn.Parameter(torch.empty(n_vars, d, d))
        self.fc1_b = nn.Parameter(torch.empty(n_vars, d))
        self.fc2_w = nn.Parameter(torch.empty(n_vars, 2 * d, d))
        self.fc2_b = nn.Parameter(torch.empty(n_vars, 2 * d))
        self.ln_w = nn.Parameter(torch.ones(n_vars, d))
        self.ln_b = nn.Parameter(torch.zeros(n_vars, d))
        self._linear = grouped_linear

    def compile_fused(self) -> None:
        """torch.compile (static shapes, in place: parameter names unchanged) with the block-diagonal linears."""
        self._linear = grouped_linear_block_diag
        self.compile(dynamic=False, options=inductor_options())

    def reset_parameters(self, gen: torch.Generator) -> None:
        d = self.fc1_w.shape[-1]
        for p in (self.fc1_w, self.fc1_b, self.fc2_w, self.fc2_b):
            uniform_(p, 1.0 / math.sqrt(d), gen)
        nn.init.ones_(self.ln_w)
        nn.init.zeros_(self.ln_b)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        """a: (..., F, d) -> (..., F, d)."""
        return self._after_fc1(a, self._linear(a, self.fc1_w, self.fc1_b))

    def forward_embedded(self, x: torch.Tensor, embed_w: torch.Tensor, embed_b: torch.Tensor) -> torch.Tensor:
        """`forward(embed(x, embed_w, embed_b))` with fc1 folded into the embedding: each variable's a is
        affine in its scalar x, so fc1(a) = x·(W1 embed_w) + (W1 embed_b + b1), a multiply-add, not a GEMM.
        x: (..., F) -> (..., F, d)."""
        u = torch.einsum("foi,fi->fo", self.fc1_w, embed_w)  # (F, d)
        c = torch.einsum("foi,fi->fo", self.fc1_w, embed_b) + self.fc1_b
        return self._after_fc1(embed(x, embed_w, embed_b), x.unsqueeze(-1) * u + c)

    def _after_fc1(self, a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The GRN from fc1's output h on: ELU, fc2, GLU, the residual a and the LayerNorm. (..., F, d)."""
        h = self._linear(F.elu(h), self.fc2_w, self.fc2_b)  # (..., F, 2d)
        h = F.glu(h, dim=-1)  # (..., F, d)
        out = F.layer_norm(a + h, a.shape[-1:])
        return out * self.ln_w + self.ln_b


class GRN(nn.Module):
    """One GRN from d_in to d_out through width d_hidden, with a linear skip (d_in != d_out)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, 2 * d_out)
        self.skip = nn.Linear(d_in, d_out)
        self.norm = nn.LayerNorm(d_out)

    def reset_parameters(self, gen: torch.Generator) -> None:
        for layer in (self.fc1, self.fc2, self.skip):
            init_linear(layer, gen)
        self.norm.reset_parameters()

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        h = self.fc1(a)  # fc1, then the skip: the order the GRN always ran them in
        return self._after_fc1(self.skip(a), h)

    def forward_embedded(self, x: torch.Tensor, embed_w: torch.Tensor, embed_b: torch.Tensor) -> torch.Tensor:
        """`forward(embed(x, embed_w, embed_b).flatten(-2))` with fc1 and skip folded into the embedding
        (`fold_embedding`): their GEMMs read F inputs a row instead of F·d_v. x: (..., F) -> (..., d_out)."""
        w1, b1 = fold_embedding(self.fc1.weight, self.fc1.bias, embed_w, embed_b)
        ws, bs = fold_embedding(self.skip.weight, self.skip.bias, embed_w, embed_b)
        h = F.linear(x, w1, b1)
        return self._after_fc1(F.linear(x, ws, bs), h)

    def _after_fc1(self, skipped: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The GRN from fc1's output h on, with the skip's output: LayerNorm(skip + GLU(fc2(ELU(h))))."""
        return self.norm(skipped + F.glu(self.fc2(F.elu(h)), dim=-1))


def embed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x: (B, K, F), w, b: (F, d_v) -> (B, K, F, d_v): Linear(1 -> d_v) per variable."""
    return x.unsqueeze(-1) * w + b


def select(logits: torch.Tensor, xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: (B, K, F), xi: (B, K, F, d_v) -> the weighted variables (B, K, F * d_v) and v (B, K, F)."""
    v = torch.softmax(logits, dim=-1)
    return (v.unsqueeze(-1) * xi).flatten(-2), v


class VSN(nn.Module):
    """x: (B, K, F) -> (B, K, D), plus the selection weights v: (B, K, F). With `fused_grn` the variables'
    embeddings, GRNs and their weighting are one op (`perception.ops.grn_select`, kernels by `backend`), which
    keeps none of their (B, K, F, ·) intermediates. With `fold_embed` the GEMMs that read the embedding (the
    variables' fc1, the selection GRN's fc1 and skip) read x instead (`fold_embedding`): the same function,
    fewer FLOPs and one (B, K, F·d_v) tensor fewer."""

    def __init__(
        self,
        n_features: int,
        d_var: int,
        d_model: int,
        fused_grn: bool = False,
        backend: str = "auto",
        fold_embed: bool = False,
    ):
        super().__init__()
        self.n_features, self.d_var = n_features, d_var
        self.fused_grn, self.backend, self.fold_embed = fused_grn, backend, fold_embed
        self.embed_w = nn.Parameter(torch.empty(n_features, d_var))  # Linear(1 -> d_v) per variable
        self.embed_b = nn.Parameter(torch.empty(n_features, d_var))
        self.var_grn = GroupedGRN(n_features, d_var)
        self.select_grn = GRN(n_features * d_var, d_model, n_features)
        self.out = nn.Linear(n_features * d_var, d_model)
        self._embed, self._select = embed, select
        self._var_grn_embedded = self.var_grn.forward_embedded  # the fold_embed forms
        self._select_grn_embedded = self.select_grn.forward_embedded

    def compile_regions(self) -> None:
        """torch.compile (static shapes) in four regions: embed, the variable GRNs (their linears as one
        block-diagonal GEMM each), the selection GRN and the weighting. One region for the whole VSN returned
        wrong gradients at production size on an H200 (torch 2.11 Inductor; B=4, K=6000: the selection GRN's
        and the embedding's gradients off by 1e2-1e5 relative, right at K=600); the four regions match eager
        (benchmarks/compile_check.py)."""
        self._embed = torch.compile(embed, dynamic=False, options=inductor_options())
        self._select = torch.compile(select, dynamic=False, options=inductor_options())
        if not self.fused_grn:  # else the GRNs run in grn_select's kernels
            self.var_grn.compile_fused()  # in place: parameter names and checkpoints unchanged
        self.select_grn.compile(dynamic=False, options=inductor_options())
        if self.fold_embed:  # the same two regions, reading x instead of the embedding
            self._var_grn_embedded = torch.compile(
                self.var_grn.forward_embedded, dynamic=False, options=inductor_options()
            )
            self._select_grn_embedded = torch.compile(
                self.select_grn.forward_embedded, dynamic=False, options=inductor_options()
            )

    def reset_parameters(self, gen: torch.Generator) -> None:
        uniform_(self.embed_w, 1.0, gen)  # fan_in 1
        uniform_(self.embed_b, 1.0, gen)
        self.var_grn.reset_parameters(gen)
        self.select_grn.reset_parameters(gen)
        init_linear(self.out, gen)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ew, eb = self.embed_w, self.embed_b
        if self.fused_grn:
            if self.fold_embed:
                logits = self._select_grn_embedded(x, ew, eb)  # (B, K, F)
            else:
                logits = self.select_grn(self._embed(x, ew, eb).flatten(-2))
            v = torch.softmax(logits, dim=-1)  # (B, K, F)
            g = self.var_grn
            weights = (ew, eb, g.fc1_w, g.fc1_b, g.fc2_w, g.fc2_b, g.ln_w, g.ln_b)
            # under autocast in the dtype `out` reads: the kernels round once, and no cast pass follows
            amp = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else None
            xi = grn_select(x, v, *weights, out_dtype=amp, backend=self.backend)  # (B, K, F, d_v)
            return self.out(xi.flatten(-2)), v
        if self.fold_embed:  # the GRNs read x and build what they need of the embedding themselves
            xi = self._var_grn_embedded(x, ew, eb)  # (B, K, F, d_v)
            logits = self._select_grn_embedded(x, ew, eb)  # (B, K, F)
        else:
            e = self._embed(x, ew, eb)
            xi, logits = self.var_grn(e), self.select_grn(e.flatten(-2))
        selected, v = self._select(logits, xi)  # (B, K, F * d_v), (B, K, F)
        return self.out(selected), v
