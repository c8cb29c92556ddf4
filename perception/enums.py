"""The one enum-or-string helper: configs hold enum members after validation and plain strings
when built by hand or read back from MLflow params."""

from __future__ import annotations

from typing import Any


def enum_value(x: Any) -> Any:
    """An enum member's value, or `x` itself when it is already plain."""
    return getattr(x, "value", x)
