"""One precision per sweep: the gate refuses arms trained at different trainer.precision values, so the
precision a sweep starts with is recorded on its parent run (tag `trainer.precision`) and a sweep
continued later keeps it, even where the default has changed since (a sweep started in tf32 continues
in tf32). Naming another precision for a started sweep is an error; a new sweep id trains at the new one."""

from __future__ import annotations

from typing import Optional, Sequence

from perception.errors import ConfigError

PRECISION_TAG = "trainer.precision"


def names_precision(overrides: Sequence[str]) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == PRECISION_TAG for o in overrides)


def pin_precision(
    sweep_id: str, started: Optional[str], composed: str, overrides: Sequence[str]
) -> tuple[list[str], Optional[str]]:
    """The overrides the sweep's trainings run with, and a note when they differ from what was asked.
    `started`: the parent run's tag (None: a sweep started before the tag existed, or just now)."""
    if started is None or started == composed:
        return list(overrides), None
    if names_precision(overrides):
        raise ConfigError(
            f"trainer.precision={composed}: sweep {sweep_id} was started at trainer.precision={started} (its parent "
            f"run's tag {PRECISION_TAG}) and the gate refuses arms trained at different precisions; continue it at "
            f"{started} or start a new sweep id"
        )
    return (
        [*overrides, f"{PRECISION_TAG}={started}"],
        f"sweep {sweep_id} was started at trainer.precision={started}: it continues at {started}, not at today's "
        f"default {composed} (a new sweep id trains at {composed})",
    )
