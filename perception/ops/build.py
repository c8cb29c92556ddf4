"""`python -m perception.ops.build`: compile every csrc/*.cpp and *.cu into one library for
TORCH_CUDA_ARCH_LIST (always including sm_89 and sm_90) and place it, with a manifest of the torch
version and architectures it was built for, in perception/ops/lib/. Run time then never calls nvcc."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from perception.atomic import atomic_write_text
from perception.ops import extension


def build(verbose: bool = False) -> Path:
    from torch.utils.cpp_extension import load

    if extension.nvcc_path() is None:
        raise SystemExit(
            "perception.ops.build: nvcc not found; install the CUDA toolkit matching torch "
            f"{torch.__version__} (CUDA {torch.version.cuda}) or set CUDA_HOME"
        )
    archs = extension.arch_list()
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    extension.LIB_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="perception-ops-build-") as tmp:
        load(
            name=extension.LIB_NAME,
            sources=extension.sources(),
            build_directory=tmp,
            is_python_module=False,
            verbose=verbose,
            **extension.compile_flags(),
        )
        built = Path(tmp) / f"{extension.LIB_NAME}.so"
        target = extension.LIB_DIR / f"{extension.LIB_NAME}.so"
        staged = target.with_suffix(".so.tmp")
        shutil.copyfile(built, staged)
        os.replace(staged, target)  # a loader never sees a half-copied library
    manifest = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "archs": archs,
        "sources": [Path(s).name for s in extension.sources()],
    }
    atomic_write_text(extension.manifest_path(), json.dumps(manifest, indent=2) + "\n")
    # The temp file behind the atomic write is private (0600); a shared install's other users must read it.
    os.chmod(extension.manifest_path(), 0o644)
    (extension.LIB_DIR / ".gitignore").write_text("*\n")  # build outputs only
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perception.ops.build", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    target = build(verbose=args.verbose)
    print(f"built {target} for TORCH_CUDA_ARCH_LIST={extension.arch_list()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
