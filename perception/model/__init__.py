"""The perception model: VSN, Mamba2, attention pools, CfC, heads; its loss and checkpoints.
Importable with torch and numpy alone (the GPU machine has no hydra or mlflow)."""

from perception.model.config import AttentionPoolVariant, ModelConfig, OpsBackend
from perception.model.loss import masked_bce
from perception.model.model import PerceptionModel

__all__ = ["AttentionPoolVariant", "ModelConfig", "OpsBackend", "PerceptionModel", "masked_bce"]
