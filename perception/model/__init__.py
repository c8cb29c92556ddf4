"""The perception model: VSN, Mamba2, attention pools, CfC, heads; its loss and checkpoints.
Importable with torch and numpy alone (the GPU machine has no hydra or mlflow). The names below load on
first use, so that the config (`perception.model.config`, read by every command's config composition)
does not import torch: `perception-data build` has no use for it."""

from importlib import import_module

_WHERE = {"AttentionPoolVariant": "config", "ModelConfig": "config", "OpsBackend": "config",
          "PerceptionModel": "model", "masked_bce": "loss"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'perception.model' has no attribute {name!r}")
    value = getattr(import_module(f"perception.model.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
