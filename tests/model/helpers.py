"""Tiny model configurations for the model tests (seconds on 2 CPU cores)."""

from __future__ import annotations

from perception.model.config import MambaConfig, ModelConfig, VSNConfig

N_FEATURES = 5
HORIZONS = [2, 5, 10]


def tiny_config(
    variant: str = "shared", inverted_pool: bool = False, d_model: int = 16, ops: str = "ref"
) -> ModelConfig:
    return ModelConfig(
        attention_pool=variant,
        d_model=d_model,
        vsn=VSNConfig(d_var=4),
        mamba=MambaConfig(n_layers=1, d_state=8, headdim=8, expand=2, d_conv=4, chunk=8),
        inverted_pool=inverted_pool,
        ops=ops,
    )
