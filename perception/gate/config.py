"""Gate configuration (`conf/gate/<name>.yaml`, DESIGN §7): deployment weights per horizon and the
rule thresholds. The files are deltas over `GateConfig`'s defaults; command-line overrides
(`gate.alpha=0.01`) come last. Loaded through an OmegaConf structured config, so unknown keys and
wrong types fail with the key's name; the checks that need the runs' horizons live in `check_horizons`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perception.errors import ConfigError

MIN_BOOTSTRAP = 2000  # DESIGN §7: at least 2,000 resamples
OVERRIDE_PREFIX = "gate."


@dataclass
class GateConfig:
    weights: dict[int, float] = field(default_factory=lambda: {6000: 1.0})
    min_lift: float = 0.01
    noise_floor: float = 0.024
    shift_horizons: list[int] = field(default_factory=lambda: [30, 100])
    shift_allows_loss: bool = True
    alpha: float = 0.05
    n_bootstrap: int = MIN_BOOTSTRAP
    seed: int = 0
    source: str = ""  # the file it came from, for messages and the report


def available_configs() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in _conf_dir().iterdir() if p.name.endswith(".yaml"))


def config_exists(name: str) -> bool:
    return conf_path(name).is_file()


def conf_path(name: str):
    """The shipped conf/gate/<name>.yaml (it may not exist)."""
    return _conf_dir() / f"{name}.yaml"


def load_gate_config(name: str, overrides: Sequence[str] = ()) -> GateConfig:
    """`name` of a file in conf/gate/, or a path to a YAML file of the same keys; then `overrides`
    such as `gate.alpha=0.01` or `gate.weights={1000: 1.0}`."""
    path = Path(name)
    if not (name.endswith((".yaml", ".yml")) and path.is_file()):
        path = Path(str(conf_path(name)))
        if not path.is_file():
            raise ConfigError(
                f"gate config {name!r} not found: expected one of {available_configs()} "
                f"(conf/gate/<name>.yaml) or a path to a .yaml file"
            )
    try:
        layers = [OmegaConf.load(path), _dotlist(overrides)]
        merged = OmegaConf.structured(GateConfig)
        for layer in layers:
            if "weights" in layer:  # given weights replace the ones before, not add to them
                merged.weights = {}
            merged = OmegaConf.merge(merged, layer)
        cfg: GateConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(f"gate config {path}" + (f" with {list(overrides)}" if overrides else "") + f": {e}") from e
    cfg.source = str(path) + (" " + " ".join(overrides) if overrides else "")
    _check_values(cfg)
    return cfg


def _dotlist(overrides: Sequence[str]):
    """`gate.KEY=VALUE` items as one config layer; anything else is a usage error naming the item."""
    items = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.startswith(OVERRIDE_PREFIX) or key == OVERRIDE_PREFIX:
            raise ConfigError(f"gate override {item!r}: expected {OVERRIDE_PREFIX}KEY=VALUE, e.g. gate.alpha=0.01")
        items.append(item[len(OVERRIDE_PREFIX) :])
    return OmegaConf.from_dotlist(items)


def check_horizons(cfg: GateConfig, horizons: list[int]) -> None:
    """Every weighted or shift horizon must be one the runs predict (usage error otherwise)."""
    for key, named in (
        ("weights", [h for h, w in cfg.weights.items() if w != 0]),
        ("shift_horizons", cfg.shift_horizons),
    ):
        missing = [h for h in named if h not in horizons]
        if missing:
            raise ConfigError(
                f"gate config {cfg.source}: {key} names horizon(s) {missing}, but the runs' "
                f"data.horizons are {horizons}"
            )


def _check_values(cfg: GateConfig) -> None:
    where = f"gate config {cfg.source}"
    for h, w in cfg.weights.items():
        if h <= 0:
            raise ConfigError(f"{where}: weights key {h} is not a horizon (expected a positive snapshot count)")
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"{where}: weights[{h}] = {w}; expected a finite weight >= 0")
    if sum(cfg.weights.values()) <= 0:
        raise ConfigError(f"{where}: weights sum to 0; give at least one horizon a positive weight")
    if not cfg.shift_horizons:
        raise ConfigError(f"{where}: shift_horizons is empty; expected at least one horizon")
    if len(set(cfg.shift_horizons)) != len(cfg.shift_horizons):
        raise ConfigError(f"{where}: shift_horizons {cfg.shift_horizons} repeats a horizon")
    for key in ("min_lift", "noise_floor"):
        value = getattr(cfg, key)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: {key} = {value}; expected a finite number >= 0")
    if not 0 < cfg.alpha < 1:
        raise ConfigError(f"{where}: alpha = {cfg.alpha}; expected 0 < alpha < 1")
    if cfg.n_bootstrap < MIN_BOOTSTRAP:
        raise ConfigError(f"{where}: n_bootstrap = {cfg.n_bootstrap}; expected at least {MIN_BOOTSTRAP} resamples")


def _conf_dir():
    return resources.files("perception.conf") / "gate"
