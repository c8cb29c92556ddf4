"""A sweep's Hydra overrides, every run's alike: checked (no per-run field, no flag) before they are
composed (`perception.train.compose.composed`), and the gate config their experiment chose."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from perception.arms import ARM_FIELDS
from perception.errors import ConfigError

if TYPE_CHECKING:
    from perception.train.config import Config

AUTO_GATE_CONFIG = "auto"  # the gate config the experiment's defaults choose (experiment_gate_config)
# Set per run by the sweep itself; a user override would silently break the study's design.
RESERVED_KEYS = (
    "sweep_id",
    "arm",
    "replicate",
    *(f"model.{key}" for key in ARM_FIELDS),  # the arm's model fields
    "data.fold",
    "tracking.parent_run_id",
)


def check_overrides(overrides: Sequence[str]) -> None:
    for o in overrides:
        if o.startswith("-"):
            raise ConfigError(f"{o!r}: the sweep takes Hydra overrides only (key=value), not flags")
        key = o.lstrip("+~").split("=", 1)[0]
        if key in RESERVED_KEYS:
            raise ConfigError(
                f"override {o!r}: {key} is set by the sweep for each run; remove it (use --sweep-id to name the sweep)"
            )


def experiment_gate_config(cfg: "Config") -> str:
    """The gate config the composed experiment chose in its defaults (`- override /gate: NAME`)."""
    if cfg.gate is None:
        from perception.gate.config import available_configs

        raise ConfigError(
            f"experiment {cfg.experiment_name!r} chooses no gate config: add `- override /gate: NAME` to the "
            f"defaults of conf/experiment/{cfg.experiment_name}.yaml, NAME one of {available_configs()} "
            f"(conf/gate/NAME.yaml), or pass the override gate=NAME"
        )
    return str(cfg.gate)


def resolve_gate_config(name: str, cfg: "Config") -> str:
    """The workflow's `gate-config` parameter: `auto` is the experiment's own, anything else as given."""
    return experiment_gate_config(cfg) if name == AUTO_GATE_CONFIG else name
