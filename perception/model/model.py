"""The perception model (DESIGN §3): VSN -> Mamba2 x L -> LN_b -> attention pool (Q = 1 or H)
-> (optional) inverted pool + merge -> CfC over K from h_0 = mean_q ctx -> heads -> logits (B, H)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from perception import ops
from perception.enums import as_enum
from perception.errors import ConfigError, DataError
from perception.model.cfc import CfC
from perception.model.compiled import inductor_options
from perception.model.config import AttentionPoolVariant, ModelConfig, OpsBackend
from perception.model.heads import Heads
from perception.model.init import module_generator
from perception.model.mamba2 import Mamba2
from perception.model.pools import AttentionPool, InvertedPool
from perception.model.vsn import VSN

TRUNK_PREFIXES = ("vsn.", "mamba.", "ln_b.", "cfc.")  # identical in both variants
ARM_MODULES = ("pool", "head")  # where arms differ; an A/A twin reseeds only these


class UpcastLayerNorm(nn.LayerNorm):
    """LayerNorm in its weight's dtype (fp32; fp64 in tests) of an input in its own (the trunk's bf16 under
    autocast). Compiled, the upcast and the norm are one pass each way, where eager writes an upcast copy first."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(h.to(self.weight.dtype), self.normalized_shape, self.weight, self.bias, self.eps)


class PerceptionModel(nn.Module):
    dt_scale: torch.Tensor  # a buffer (register_buffer), which the stubs cannot see

    def __init__(self, cfg: ModelConfig, n_features: int, horizons: Sequence[int], seed: int):
        super().__init__()
        # None: no arm applied (a model built by hand, not by a training): the shared pool, the control's
        self.variant = as_enum(
            AttentionPoolVariant, cfg.attention_pool or AttentionPoolVariant.shared, "model.attention_pool"
        )
        backend = as_enum(OpsBackend, cfg.ops, "model.ops").value
        d = int(cfg.d_model)
        if n_features < 1 or d < 1 or not horizons:
            raise ConfigError(
                f"PerceptionModel needs n_features >= 1, model.d_model >= 1 and horizons; got "
                f"{n_features}, {d}, {list(horizons)}"
            )
        self.cfg, self.n_features, self.horizons = cfg, int(n_features), [int(h) for h in horizons]
        per_horizon = self.variant is AttentionPoolVariant.per_horizon
        self.n_queries = len(self.horizons) if per_horizon else 1
        m = cfg.mamba

        with torch.random.fork_rng(devices=[]):  # module constructors must not move the global RNG
            self.vsn = VSN(
                self.n_features, int(cfg.vsn.d_var), d, bool(cfg.vsn.fused_grn), backend, bool(cfg.vsn.fold_embed)
            )
            self.mamba = Mamba2(
                d, int(m.n_layers), int(m.d_state), int(m.headdim), int(m.expand), int(m.d_conv), int(m.chunk), m.ssd
            )
            self.ln_b = UpcastLayerNorm(d)
            self.pool = AttentionPool(self.n_queries, d, per_horizon, backend)
            self.inv_pool = InvertedPool(backend) if cfg.inverted_pool else None
            self.cfc = CfC(d, backend)
            path_a = per_horizon or bool(cfg.shared_context_to_heads)
            self.head = Heads(len(self.horizons), d, path_a, float(cfg.head_aux_weight))
        self.backend = backend
        self.checkpointing = bool(cfg.activation_checkpointing)
        self.register_buffer("dt_scale", torch.ones(()), persistent=True)  # median Δt of training data

        twin = "/twin" if cfg.twin else ""
        for name, module in (
            ("vsn", self.vsn),
            ("mamba", self.mamba),
            ("pool", self.pool),
            ("cfc", self.cfc),
            ("head", self.head),
        ):
            module.reset_parameters(module_generator(seed, name + (twin if name in ARM_MODULES else "")))
        self.ln_b.reset_parameters()  # ones / zeros: nothing to draw
        if cfg.compile_trunk:
            self.vsn.compile_regions()
            for block in self.mamba.layers:
                block.compile_fused()
            self.ln_b.compile(dynamic=False, options=inductor_options())  # in place: names unchanged

    @property
    def trunk_prefixes(self) -> tuple[str, ...]:
        return TRUNK_PREFIXES

    def set_dt_scale(self, median_dt: float) -> None:
        """ts_t = Δt_t / median Δt of the training data; kept in the checkpoint as `dt_scale`."""
        value = float(median_dt)
        if not math.isfinite(value) or value <= 0:
            raise DataError(f"median Δt of the training data must be finite and > 0 seconds; got {median_dt!r}")
        self.dt_scale.fill_(value)

    def forward(self, x: torch.Tensor, dt: torch.Tensor, return_attention: bool = False):
        """x: (B, K, F) float32, dt: (B, K) seconds -> logits (B, H) [, attention (B, Q, K)]."""
        if x.dim() != 3 or x.shape[-1] != self.n_features or dt.shape != x.shape[:2]:
            raise ValueError(
                f"PerceptionModel expects x (B, K, {self.n_features}) and dt (B, K); got x "
                f"{tuple(x.shape)} and dt {tuple(dt.shape)}"
            )
        if self.checkpointing and torch.is_grad_enabled():
            h = checkpoint(lambda t: self.vsn(t)[0], x, use_reentrant=False)  # (B, K, D)
            for layer in self.mamba.layers:
                h = checkpoint(layer, h, use_reentrant=False)
        else:
            h = self.mamba(self.vsn(x)[0])  # (B, K, D)
        if not torch.is_autocast_enabled(h.device.type):
            return self._pool_scan_heads(h, dt, return_attention)
        with torch.autocast(h.device.type, enabled=False):
            return self._pool_scan_heads(h, dt, return_attention)

    def _pool_scan_heads(self, h: torch.Tensor, dt: torch.Tensor, return_attention: bool):
        """Always fp32, also under autocast (trainer.precision=bf16): the pool and scan kernels take fp32
        only, and softmax statistics and a scan over thousands of steps need it. h: the trunk's output, bf16
        under autocast, which LN_b upcasts."""
        lnb = self.ln_b(h)  # (B, K, D)
        ctx = self.pool(lnb)  # (B, Q, D)
        if self.inv_pool is not None:
            ctx = ops.inv_pool_merge(ctx, self.inv_pool(lnb), backend=self.backend)
        ts = dt.to(lnb.dtype) / self.dt_scale  # (B, K)
        h_seq = self.cfc(lnb, ts, ctx.mean(dim=1))  # (B, K, D)
        logits = self.head(h_seq[:, -1], ctx)  # (B, H)
        if return_attention:
            return logits, self.pool.weights(lnb)
        return logits
