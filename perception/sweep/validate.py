"""Checks a workflow's parameters before `render` writes it or `submit` posts it, so a mistake costs
a second here rather than a GPU-day there: the pods' shared Hydra overrides, filled with the
parameters, must compose (compose only: no data is read), the gate config must exist and weigh only
horizons the experiment predicts, and the sweep id must be usable. Every error names the parameter.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from perception.errors import ConfigError

PLACEHOLDER = re.compile(r"\{\{workflow\.parameters\.([A-Za-z0-9_.-]+)\}\}")


def check_parameters(defaults: Mapping[str, str], values: Mapping[str, str], shared: Sequence[str]) -> None:
    """`defaults`: the definition's parameter values; `values`: the same with the user's applied;
    `shared`: the overrides every pod runs with, holding {{workflow.parameters.NAME}} placeholders."""
    from perception.gate.config import check_horizons, load_gate_config
    from perception.paths import check_sweep_id
    from perception.sweep.overrides import AUTO_GATE_CONFIG, resolve_gate_config

    if values.get("sweep-id"):
        try:
            check_sweep_id(values["sweep-id"])
        except ConfigError as exc:
            raise ConfigError(f"-p sweep-id={values['sweep-id']}: {exc}") from None
    cfg = _checked_config(defaults, values, shared)
    given = values.get("gate-config", AUTO_GATE_CONFIG)
    where = f"-p gate-config={given}"
    try:
        name = resolve_gate_config(given, cfg)
        where += f" (the experiment's: {name})" if name != given else ""
        check_horizons(load_gate_config(name), [int(h) for h in cfg.data.horizons])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def fill(shared: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The overrides as a pod runs them: each placeholder replaced by its parameter's value."""

    def value(m: re.Match) -> str:
        if m.group(1) not in values:
            raise ConfigError(f"the workflow's overrides name parameter {m.group(1)!r}, which it does not define")
        return values[m.group(1)]

    return [PLACEHOLDER.sub(value, o) for o in shared]


def _checked(overrides: Sequence[str]):
    """Composed, plus the checks of a training's start that need no files (the data lives on the
    cluster's market-data volume, not here)."""
    from perception.enums import enum_value
    from perception.train.compose import composed

    cfg = composed(overrides)
    if enum_value(cfg.data.source) == "dbn" and not cfg.data.paths:
        raise ConfigError(
            "data.paths is empty: data=dbn needs DBN files or globs on the market-data volume, "
            "e.g. -p 'data-paths=[/data/ES/*.dbn.zst]'"
        )
    if not (isinstance(cfg.trainer.epochs, int) and cfg.trainer.epochs >= 1):
        raise ConfigError(f"trainer.epochs={cfg.trainer.epochs}: expected a positive integer")
    return cfg


def _checked_config(defaults: Mapping[str, str], values: Mapping[str, str], shared: Sequence[str]):
    """The checked training config; on an error, the parameter that alone causes it is named."""
    try:
        return _checked(fill(shared, values))
    except ConfigError as exc:
        error = exc
    used = {m.group(1) for o in shared for m in PLACEHOLDER.finditer(o)}
    changed = [n for n in sorted(used) if values.get(n) != defaults.get(n)]
    for name in changed:
        try:
            _checked(fill(shared, {**defaults, name: values[name]}))
        except ConfigError as exc:
            raise ConfigError(f"-p {name}={values[name]}: {exc}") from None
    given = ", ".join(f"-p {n}={values[n]}" for n in changed) or "the definition's defaults"
    raise ConfigError(f"{given}: {error}") from None
