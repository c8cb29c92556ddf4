"""The flattened config MLflow logs as params (`data.window`, `data.horizons` as "[30, 100, ...]")."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf


def flatten_config(cfg: Any) -> dict[str, str]:
    if isinstance(cfg, DictConfig):
        tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    elif is_dataclass(cfg) and not isinstance(cfg, type):
        tree = asdict(cfg)
    else:
        tree = dict(cfg)
    out: dict[str, str] = {}
    _walk(tree, "", out)
    return out


def _walk(node: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _walk(v, f"{prefix}{k}.", out) if isinstance(v, dict) else out.__setitem__(f"{prefix}{k}", _text(v))
    else:
        out[prefix.rstrip(".")] = _text(node)


def _text(v: Any) -> str:
    if isinstance(v, Enum):
        return str(v.value)
    if isinstance(v, (list, tuple)):
        return str([_plain(x) for x in v])
    return str(v)


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v
