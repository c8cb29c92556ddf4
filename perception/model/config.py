"""Model configuration (`conf/model/*.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from perception.arms import AttentionPoolVariant


class OpsBackend(str, Enum):
    auto = "auto"  # CUDA kernels on CUDA tensors when the extension loads, else reference ops
    ref = "ref"
    cuda = "cuda"


class SSDBackend(str, Enum):
    chunked = "chunked"  # the chunked SSD in PyTorch (any device; deterministic)
    # EXPERIMENTAL: fla-core's Triton kernels (CUDA; saves q, k, v, g only): perception/model/ssd_fla.py.
    # Not yet verified where it would matter: untested on the L40S, refused on Hopper with Triton < 3.7.1
    fla = "fla"
    # mamba_ssm's fused chunk-scan Triton kernels in their deterministic mode (CUDA; experiment=production's):
    # perception/model/ssd_mamba.py (docs/performance.md "The fused SSD from mamba_ssm")
    mamba = "mamba"


@dataclass
class VSNConfig:
    d_var: int = 8  # per-variable width; a TFT VSN at width D would hold [B, K, F, D]
    # The variables' GRNs and their weighting in one Triton pass each way on CUDA tensors (perception/ops/grn.py;
    # model.ops picks kernel or reference as for every op). Faster, 2 GiB less, reproducible, quality holds:
    # experiment=production's (docs/performance.md "Production's chunk and fused GRN")
    fused_grn: bool = False
    # The linears that read the embedding folded into it, reading the F raw features (exact in arithmetic,
    # another rounding; perception/model/vsn.py fold_embedding). Faster, quality holds, reproducible;
    # experiment=production's (docs/performance.md "The VSN's embedding folded into its linears")
    fold_embed: bool = False


@dataclass
class MambaConfig:
    n_layers: int = 2
    d_state: int = 64
    headdim: int = 32
    expand: int = 2
    d_conv: int = 4
    chunk: int = 128  # the chunk's [chunk x chunk] decay matrices dominate activation memory
    ssd: SSDBackend = SSDBackend.chunked  # chunked | fla | mamba (both experimental)


@dataclass
class ModelConfig:
    # attention_pool, shared_context_to_heads and twin are the arm's (perception/arms.py): a training sets
    # them from `arm=NAME`. None: as the arm has them; given alone, they name the arm
    attention_pool: Optional[AttentionPoolVariant] = None
    d_model: int = 128
    vsn: VSNConfig = field(default_factory=VSNConfig)
    mamba: MambaConfig = field(default_factory=MambaConfig)
    inverted_pool: bool = False
    head_aux_weight: float = 0.25  # alpha of Path A heads (per_horizon)
    # ablation: SharedQuery whose one context also feeds Path A heads [H, 2D], separating "per-horizon
    # queries" from "context skip" (the shared context otherwise reaches the logits only through h_0)
    shared_context_to_heads: Optional[bool] = None
    # the A/A twin of an arm: another seed for the pool query and the heads only, the modules in which
    # real arms differ; the trunk's init stays that of `seed`
    twin: Optional[bool] = None
    ops: OpsBackend = OpsBackend.auto
    # recompute VSN and Mamba2 activations in backward instead of keeping them: at K = 6000 they are
    # most of the activation memory (benchmarks/model_step.py); costs about one extra trunk forward
    activation_checkpointing: bool = False
    # torch.compile (static shapes) of the VSN and each Mamba2 block: their width-8 linears, norms and
    # elementwise glue become a few fused kernels; the custom ops are outside the compiled regions
    compile_trunk: bool = False
