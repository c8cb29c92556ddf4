"""The one enum-or-string helper: configs hold enum members after validation and plain strings
when built by hand or read back from MLflow params."""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from perception.errors import ConfigError

E = TypeVar("E", bound=Enum)


def enum_value(x: Any) -> Any:
    """An enum member's value, or `x` itself when it is already plain."""
    return getattr(x, "value", x)


def as_enum(kind: type[E], value: Any, key: str) -> E:
    """`value` as a member of `kind`; a ConfigError naming `key` and the allowed values otherwise."""
    try:
        return kind(enum_value(value))
    except ValueError:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(v.value for v in kind)}") from None
