"""Overrides checked against the config's schema before Hydra sees them, so a typo gets the right hint.

Hydra answers an unknown key with "use +trainer.epoch=1", and following it adds a key nothing reads
(the run trains the default epochs, silently). Here an unknown key or group option names the nearest
known ones, and `+` may add a key only under an open mapping of the schema (a `dict` field, not a
dataclass), where a new key means something (DESIGN §7)."""

from __future__ import annotations

import difflib
from importlib import resources
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from perception.errors import ConfigError

CONFIG_MODULE = "perception.conf"
HYDRA_PREFIXES = ("hydra.", "hydra/")


def schema_keys(schema: Any) -> tuple[set[str], set[str]]:
    """(every key of the structured schema, nodes and leaves alike; the open mappings among them)."""
    keys: set[str] = set()
    open_maps: set[str] = set()

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            key = prefix + str(name)
            keys.add(key)
            child = node._get_node(name)
            if isinstance(child, DictConfig):
                if OmegaConf.get_type(child) is dict:  # a mapping field: its keys are the user's
                    open_maps.add(key)
                else:
                    walk(child, key + ".")

    walk(OmegaConf.structured(schema), "")
    return keys, open_maps


def group_options(config_module: str = CONFIG_MODULE) -> dict[str, list[str]]:
    """The config groups of conf/ and the options each offers (its YAML files)."""
    root = resources.files(config_module)
    return {
        d.name: sorted(f.name[: -len(".yaml")] for f in d.iterdir() if f.name.endswith(".yaml"))
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith("__")
    }


def nearest(word: str, known: Sequence[str], n: int = 3) -> list[str]:
    """The known words closest to `word`; also matched by the last dotted part (`epoch` → trainer.epochs)."""
    close = difflib.get_close_matches(word, known, n=n, cutoff=0.75)
    if close:
        return close
    by_leaf: dict[str, list[str]] = {}
    for k in known:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    leaf = word.rsplit(".", 1)[-1]
    return [k for m in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.75) for k in by_leaf[m]][:n]


def check_override_keys(overrides: Sequence[str], schema: Any, groups: Optional[dict[str, list[str]]] = None) -> None:
    """Raises ConfigError for the first override whose key or group option does not exist, or that adds a
    key with `+` where the schema takes none. Syntax errors are left to Hydra, which names them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    keys, open_maps = schema_keys(schema)
    groups = group_options() if groups is None else groups
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return
    for o in parsed:
        key, line = o.key_or_group, o.input_line
        assert line is not None  # the parser keeps each override's own text
        if key.startswith(HYDRA_PREFIXES) or key == "hydra":
            continue
        if key in groups and not o.is_delete():
            _check_option(line, key, o.value(), groups[key])
            continue
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        if key in keys:
            if o.is_add():
                raise ConfigError(f"override {line!r}: {key} exists already; set it without '+': {line.lstrip('+')}")
            continue
        if (o.is_add() or o.is_force_add()) and parent in open_maps:
            continue
        raise ConfigError(
            _unknown(line, key, parent, keys, set(groups), open_maps, adding=o.is_add() or o.is_force_add())
        )


def _check_option(line: str, group: str, value: Any, options: list[str]) -> None:
    if not isinstance(value, str) or value in options:
        return  # a list of options is a multirun sweep: Hydra checks each
    hint = nearest(value, options)
    raise ConfigError(
        f"override {line!r}: {group} has no option {value!r}"
        + (f"; did you mean {' or '.join(f'{group}={h}' for h in hint)}?" if hint else "")
        + f" (options: {', '.join(options)})"
    )


def _unknown(
    line: str, key: str, parent: str, keys: set[str], groups: set[str], open_maps: set[str], adding: bool
) -> str:
    ancestors = {key.rsplit(".", n)[0] for n in range(1, key.count(".") + 1)}  # `trainer` is no hint for trainer.zzz
    hint = nearest(key, sorted((keys | groups) - ancestors))
    text = f"override {line!r}: the config has no key {key}"
    if adding:
        text += f", and '+' cannot add one: {parent or 'the top level'} takes only its own keys" + (
            f" (new keys are allowed under {', '.join(sorted(open_maps))})" if open_maps else ""
        )
    if hint:
        return text + f"; did you mean {' or '.join(hint)}?"
    parent = parent if parent in keys else ""
    siblings = (
        sorted(k.rsplit(".", 1)[-1] for k in keys if "." in k and k.rsplit(".", 1)[0] == parent)
        if parent
        else sorted(k for k in keys if "." not in k)
    )
    return text + f"; the keys {'under ' + parent if parent else 'at the top level'} are: {', '.join(siblings)}"
