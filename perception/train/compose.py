"""The one config composition every command uses (`perception-train`, `perception-data`,
`perception-sweep`): the structured configs registered once, then `conf/`'s defaults, the chosen
experiment and the overrides, exactly as `perception-train` composes them."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from perception.errors import ConfigError
from perception.train.config import Config, register_configs
from perception.train.override_keys import check_override_keys

CONFIG_MODULE = "perception.conf"  # conf/ ships inside the package, so any install finds it
CONFIG_NAME = "config"

register_configs()  # before any compose: conf/config.yaml's defaults name the structured schemas


def compose_config(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The config `perception-train` would run with these overrides: an unknown key or option, or a key
    added with `+` where none may be, is a ConfigError naming the nearest known ones; Hydra's own errors
    pass through. `with_hydra`: with Hydra's own node (`hydra.run.dir`, …) too."""
    from hydra import compose, initialize_config_module

    check_override_keys(overrides, Config)
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)


def composed(overrides: Sequence[str]) -> Config:
    """Composed and validated into the typed `Config`; any mistake is a ConfigError naming the key."""
    try:
        return OmegaConf.to_object(compose_config(overrides))  # type: ignore[return-value]
    except Exception as exc:  # composition or validation: the message names the key and allowed values
        raise ConfigError(config_error_message(exc)) from None


# OmegaConf's context lines (the dataclass names) and Hydra's search path say nothing to a user
NOISE_LINES = ("full_key:", "reference_type=", "object_type=", "Config search path:", "provider=")
# OmegaConf keeps the unformatted message in the cause; the formatted one, with the value, is above it
TEMPLATE_FIELDS = ("$VALUE", "$KEY", "$FULL_KEY", "$OBJECT_TYPE", "$REF_TYPE")


def config_error_message(exc: BaseException) -> str:
    """Hydra wraps the useful part (the key, the value and the allowed values) in the exception's cause."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        lines = [ln.strip() for ln in str(seen).splitlines() if ln.strip() and not ln.strip().startswith(NOISE_LINES)]
        text = " ".join(lines)
        if text and text != "None" and not any(f in text for f in TEMPLATE_FIELDS) \
                and not any(text in p for p in parts):
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)
