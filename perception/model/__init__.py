"""The perception model: VSN, Mamba2, attention pools, CfC, heads; its loss and checkpoints.
Importable with torch and numpy alone (the GPU machine has no hydra or mlflow). The names below load on
first use, so that the config (`perception.model.config`, read by every command's config composition)
does not import torch: `perception-data build` has no use for it."""

from perception.lazy import lazy_names

_WHERE = {
    "AttentionPoolVariant": "config",
    "ModelConfig": "config",
    "OpsBackend": "config",
    "PerceptionModel": "model",
    "masked_bce": "loss",
}
__all__ = sorted(_WHERE)
__getattr__ = lazy_names(__name__, _WHERE)
