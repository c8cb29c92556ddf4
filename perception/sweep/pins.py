"""What a sweep keeps from its start: the gate refuses arms trained at different `trainer.precision`,
`model.mamba.ssd`, `model.mamba.chunk`, `model.vsn.fold_embed` or `model.vsn.fused_grn` values (DESIGN §7),
so the values a sweep starts with are recorded on its parent run (a tag each) and a sweep continued later
keeps them, even where the experiment's defaults have changed since (a sweep started in tf32 continues in
tf32; one started with the chunked SSD, chunk 64 or the unfolded VSN continues with it). Naming another
value for a started sweep is an error; a new sweep id trains at the new defaults."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from perception.enums import enum_value
from perception.errors import ConfigError

PRECISION_TAG = "trainer.precision"
SSD_TAG = "model.mamba.ssd"
FOLD_TAG = "model.vsn.fold_embed"
CHUNK_TAG = "model.mamba.chunk"
FUSED_GRN_TAG = "model.vsn.fused_grn"
PINNED = (PRECISION_TAG, SSD_TAG, FOLD_TAG, CHUNK_TAG, FUSED_GRN_TAG)
# the name each value travels under between a workflow's steps: prepare's output file and parameter
PARAMETERS = {
    PRECISION_TAG: "precision",
    SSD_TAG: "ssd",
    FOLD_TAG: "fold-embed",
    CHUNK_TAG: "chunk",
    FUSED_GRN_TAG: "fused-grn",
}
# What a parent run made before the key's tag existed says its sweep trained with (None: nothing is pinned).
# The chunk was the experiment's own, which only production changed (64 -> 128): a production sweep started
# before then and continued later trains at 128, and the gate refuses the mix by name.
BEFORE_ITS_TAG: dict[str, Optional[str]] = {
    PRECISION_TAG: None,
    SSD_TAG: "chunked",
    FOLD_TAG: "false",
    CHUNK_TAG: None,
    FUSED_GRN_TAG: "false",
}


def composed_values(cfg: Any) -> dict[str, str]:
    """The pinned keys' values in a composed configuration."""
    return {
        PRECISION_TAG: str(enum_value(cfg.trainer.precision)),
        SSD_TAG: str(enum_value(cfg.model.mamba.ssd)),
        FOLD_TAG: str(bool(cfg.model.vsn.fold_embed)).lower(),
        CHUNK_TAG: str(int(cfg.model.mamba.chunk)),
        FUSED_GRN_TAG: str(bool(cfg.model.vsn.fused_grn)).lower(),
    }


def started_values(tags: Mapping[str, str]) -> dict[str, Optional[str]]:
    """The values a sweep's parent run records (`tags`: {} while the sweep has no parent run)."""
    return {key: tags.get(key, BEFORE_ITS_TAG[key]) if tags else None for key in PINNED}


def names_key(key: str, overrides: Sequence[str]) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides)


def pin(
    sweep_id: str, started: Mapping[str, Optional[str]], composed: Mapping[str, str], overrides: Sequence[str]
) -> tuple[list[str], list[str], dict[str, str]]:
    """The overrides the sweep's trainings run with, a note for each value that differs from what was
    composed, and the values the sweep trains at (its parent run's tags)."""
    out, notes, values = list(overrides), [], {}
    for key in PINNED:
        was, now = started.get(key), composed[key]
        values[key] = was or now
        if was is None or was == now:
            continue
        if names_key(key, overrides):
            raise ConfigError(
                f"{key}={now}: sweep {sweep_id} was started at {key}={was} (its parent run's tag {key}) and the "
                f"gate refuses arms trained at different values of it; continue it at {was} or start a new sweep id"
            )
        out.append(f"{key}={was}")
        notes.append(
            f"sweep {sweep_id} was started at {key}={was}: it continues at {was}, not at today's default {now} "
            f"(a new sweep id trains at {now})"
        )
    return out, notes, values
