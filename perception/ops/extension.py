"""Loading the compiled `perception` CUDA extension: a prebuilt library beside the package first,
never nvcc at run time when one matches. `available()` is cheap and never raises."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

LIB_DIR = Path(__file__).parent / "lib"


class ExtensionUnavailable(RuntimeError):
    pass


@lru_cache(maxsize=1)
def _load() -> str | None:
    """Returns None when loaded, else the reason it could not be."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)"
    libs = sorted(LIB_DIR.glob("*.so"))
    if not libs:
        return (
            f"no prebuilt library in {LIB_DIR}; run `python -m perception.ops.build` on a machine "
            "with nvcc (or use the Docker image, which carries it)"
        )
    try:
        for lib in libs:
            torch.ops.load_library(str(lib))
    except OSError as exc:
        return f"could not load {libs}: {exc}; rebuild with `python -m perception.ops.build`"
    return None


def available() -> bool:
    return _load() is None


def require() -> None:
    reason = _load()
    if reason is not None:
        raise ExtensionUnavailable(f"model.ops=cuda needs the perception CUDA extension: {reason}")
