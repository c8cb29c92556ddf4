"""Loading the compiled `perception` CUDA extension.

Order: the prebuilt library in `perception/ops/lib/` (made by `python -m perception.ops.build`) when its
manifest matches this torch and this GPU; else, only where nvcc exists, a JIT build of `csrc/` into
TORCH_EXTENSIONS_DIR; else the reference ops. A CPU-only install compiles nothing. After loading, every
op family's module (`perception/ops/<family>.py`) registers the fakes and autograd of its kernels, whose
schemas the library has just defined. `available()` is cheap after its first call and never raises;
`require()` raises the actionable message."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

import torch

from perception.errors import ConfigError

LIB_DIR = Path(__file__).parent / "lib"
CSRC_DIR = Path(__file__).parent / "csrc"
LIB_NAME = "perception_ops"
REQUIRED_ARCHS = ("8.9", "9.0")  # L40S (production) and H100/H200 (development), always built
# Each has register(); imported by name once the library has loaded, since they import this module.
REGISTRATION_MODULES = ("perception.ops.pool", "perception.ops.cfc")


class ExtensionUnavailable(ConfigError):
    """model.ops=cuda asked for kernels this machine cannot run; the message says what to do."""


def sources() -> list[str]:
    """Every C++/CUDA source of the one shared library (all op families)."""
    return sorted(str(p) for p in CSRC_DIR.iterdir() if p.suffix in (".cpp", ".cu"))


def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST from the environment, always including sm_89 and sm_90."""
    given = [a for a in os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").split(";") if a.strip()]
    archs = list(dict.fromkeys([a.strip() for a in given] + list(REQUIRED_ARCHS)))
    return ";".join(archs)


class CompileFlags(TypedDict):  # keyword arguments of torch.utils.cpp_extension.load
    extra_cflags: list[str]
    extra_cuda_cflags: list[str]


def compile_flags() -> CompileFlags:
    return {
        "extra_cflags": ["-O3", "-std=c++17"],
        "extra_cuda_cflags": ["-O3", "-std=c++17", "-lineinfo", "--threads", "0"],
    }


def nvcc_path() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def manifest_path() -> Path:
    return LIB_DIR / f"{LIB_NAME}.json"


def _arch_tag(arch: str) -> int:
    """ "8.9" -> 89, "9.0a" -> 90, "8.9+PTX" -> 89."""
    return int("".join(c for c in arch.replace("+PTX", "") if c.isdigit()))


def prebuilt_mismatch() -> str | None:
    """None when `lib/` holds a library built for this torch and this GPU, else why not."""
    lib = LIB_DIR / f"{LIB_NAME}.so"
    if not lib.exists() or not manifest_path().exists():
        return f"no prebuilt library in {LIB_DIR}"
    try:
        manifest = json.loads(manifest_path().read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable manifest {manifest_path()}: {exc}"
    if manifest.get("torch") != torch.__version__:
        return f"{lib} was built for torch {manifest.get('torch')}, this is torch {torch.__version__}"
    major, minor = torch.cuda.get_device_capability()
    cap = major * 10 + minor
    archs = manifest.get("archs", "").split(";")
    exact = any(_arch_tag(a) == cap for a in archs if a)
    ptx = any(a.endswith("+PTX") and _arch_tag(a) <= cap for a in archs)
    if not (exact or ptx):
        return f"{lib} was built for {manifest.get('archs')}, this GPU is sm_{cap}"
    return None


def _jit_load() -> None:
    """Builds csrc/ into TORCH_EXTENSIONS_DIR (cached there by source hash) and loads it."""
    from torch.utils.cpp_extension import load

    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    load(name=LIB_NAME, sources=sources(), is_python_module=False, verbose=False, **compile_flags())


@lru_cache(maxsize=1)
def _load() -> str | None:
    """Returns None when the kernels are loaded and registered, else the reason they are not."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)"
    try:
        mismatch = prebuilt_mismatch()
        if mismatch is None:
            torch.ops.load_library(str(LIB_DIR / f"{LIB_NAME}.so"))
        elif nvcc_path() is not None and os.environ.get("PERCEPTION_OPS_JIT", "1") != "0":
            _jit_load()
        else:
            return (
                f"{mismatch}, and no nvcc for a JIT build; run `python -m perception.ops.build` on a "
                "machine with the CUDA toolkit (nvcc) and this torch, or use the Docker image, which carries it"
            )
        register_families()
    except Exception as exc:  # noqa: BLE001 - any failure means "not available", with its reason
        return f"loading the extension failed: {exc}; rebuild with `python -m perception.ops.build`"
    return None


def register_families() -> None:
    """Fakes and autograd of every op family, onto the `perception::` schemas the library defined."""
    for name in REGISTRATION_MODULES:
        importlib.import_module(name).register()


def available() -> bool:
    try:
        return _load() is None
    except Exception:  # noqa: BLE001 - never raises, by contract
        return False


def reason() -> str | None:
    return _load()


def require() -> None:
    why = _load()
    if why is not None:
        raise ExtensionUnavailable(
            f"model.ops=cuda needs the perception CUDA extension: {why}. "
            "Set model.ops=auto or model.ops=ref to use the reference ops instead."
        )
