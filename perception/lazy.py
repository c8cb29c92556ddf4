"""Names of a package that import their module on first use (PEP 562), so that importing the
package for one light module does not load the heavy ones (torch for a config, say)."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: name -> `package.<where[name]>.name`, kept once loaded."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
