"""A sweep's Hydra overrides, every run's alike: checked (no per-run field, no flag), composed up front so
a typo fails before any work, and the gate config that belongs to the experiment they pick."""

from __future__ import annotations

from typing import Sequence

from perception.errors import ConfigError

DEFAULT_SCALE = "local"  # conf/config.yaml's default `experiment`
AUTO_GATE_CONFIG = "auto"  # the gate config that belongs to the experiment (gate_config_for)
# Set per run by the sweep itself; a user override would silently break the study's design.
RESERVED_KEYS = ("sweep_id", "arm", "replicate", "model.attention_pool", "model.shared_context_to_heads",
                 "model.twin", "data.fold", "tracking.parent_run_id")


def check_overrides(overrides: Sequence[str]) -> None:
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"{o!r}: the sweep takes Hydra overrides only (key=value), not flags")
        key = o.lstrip("+~").split("=", 1)[0]
        if key in RESERVED_KEYS:
            raise ConfigError(f"override {o!r}: {key} is set by the sweep for each run; remove it "
                              f"(use --sweep-id to name the sweep)")


def compose(overrides: Sequence[str]):
    """The training config these overrides give, composed and its values checked up front, so a typo or
    a refused value (`trainer.epochs=-1`) fails before any work: no cache build, no run directory."""
    from perception.train.compose import composed
    from perception.train.validate import check_values

    try:
        cfg = composed(overrides)
        check_values(cfg)
        return cfg
    except ConfigError as exc:
        raise ConfigError(f"overrides {list(overrides)}: {exc}") from None


def experiment_of(overrides: Sequence[str]) -> str:
    chosen = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")]
    return chosen[-1] if chosen else DEFAULT_SCALE


def gate_config_for(experiment: str) -> str:
    """conf/gate/<experiment>.yaml when it exists (its horizons match the experiment's), else default."""
    from perception.gate.config import config_exists

    return experiment if config_exists(experiment) else "default"


def resolve_gate_config(name: str, overrides: Sequence[str]) -> str:
    """The workflow's `gate-config` parameter: `auto` is the experiment's own, anything else as given."""
    return gate_config_for(experiment_of(overrides)) if name == AUTO_GATE_CONFIG else name
