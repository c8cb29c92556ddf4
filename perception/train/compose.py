"""The one config composition every command uses (`perception-train`, `perception-data`,
`perception-sweep`): the structured configs registered once, then `conf/`'s defaults, the chosen
experiment and the overrides, exactly as `perception-train` composes them."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from perception.errors import ConfigError
from perception.train.config import Config, register_configs

CONFIG_MODULE = "perception.conf"  # conf/ ships inside the package, so any install finds it
CONFIG_NAME = "config"

register_configs()  # before any compose: conf/config.yaml's defaults name the structured schemas


def compose_config(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The config `perception-train` would run with these overrides (Hydra's own errors pass through);
    `with_hydra`: with Hydra's own node (`hydra.run.dir`, …) too."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)


def composed(overrides: Sequence[str]) -> Config:
    """Composed and validated into the typed `Config`; any mistake is a ConfigError naming the key."""
    try:
        return OmegaConf.to_object(compose_config(overrides))  # type: ignore[return-value]
    except Exception as exc:  # composition or validation: the message names the key and allowed values
        raise ConfigError(config_error_message(exc)) from None


def config_error_message(exc: BaseException) -> str:
    """Hydra wraps the useful part (the key and the allowed values) in the exception's cause."""
    parts, seen = [], exc
    while seen is not None:
        text = str(seen).strip()
        if text and text not in parts:
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)
