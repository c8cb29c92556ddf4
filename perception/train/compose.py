"""The one config composition every command uses (`perception-train`, `perception-data`,
`perception-sweep`): the structured configs registered once, then `conf/`'s defaults, the chosen
experiment and the overrides, exactly as `perception-train` composes them.

`composed` is the one way to the typed `Config`; `compose_config` is its Hydra step, for a caller that
needs Hydra's own node (`perception-train`'s output directories)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from perception.errors import ConfigError
from perception.train.config import Config, register_configs
from perception.train.override_keys import check_override_keys, group_options

CONFIG_MODULE = "perception.conf"  # conf/ ships inside the package, so any install finds it
CONFIG_NAME = "config"
GATE_GROUP = "gate"  # conf/gate/: the experiment's defaults choose one (`- override /gate: NAME`)

register_configs()  # before any compose: conf/config.yaml's defaults name the structured schemas


def compose_config(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The config `perception-train` would run with these overrides: an unknown key or option, or a key
    added with `+` where none may be, is a ConfigError naming the nearest known ones; Hydra's own errors
    pass through. `with_hydra`: with Hydra's own node (`hydra.run.dir`, …) too."""
    from hydra import compose, initialize_config_module

    check_override_keys(overrides, Config, group_options(CONFIG_MODULE))
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)


def composed(overrides: Sequence[str], checked: bool = False) -> Config:
    """Composed and validated into the typed `Config`, its `gate` the name of the gate config the
    experiment chose; any mistake is a ConfigError naming the key. `checked`: the values' own checks
    too (`check_values`), so a refused value (`trainer.epochs=-1`) fails before any work."""
    from perception.train.validate import check_values

    try:
        cfg = compose_config(overrides, with_hydra=True)
        with open_dict(cfg):
            hydra = cfg.pop("hydra")
        keep_gate_name(cfg, hydra.runtime.choices)
        typed: Config = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except Exception as exc:  # composition or validation: the message names the key and allowed values
        raise ConfigError(config_error_message(exc)) from None
    if checked:
        check_values(typed)
    return typed


def keep_gate_name(cfg: DictConfig, choices: Mapping[str, Any]) -> None:
    """`gate` as the name of the chosen conf/gate/ file, not its content: the gate loads the file itself
    (perception.gate.config), with its own defaults and `gate.KEY=VALUE` overrides."""
    cfg[GATE_GROUP] = choices.get(GATE_GROUP)


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
        if (
            text
            and text != "None"
            and not any(f in text for f in TEMPLATE_FIELDS)
            and not any(text in p for p in parts)
        ):
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)
