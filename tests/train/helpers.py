"""Running the installed `perception-train` in a subprocess, and reading what a run left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np


def cli(
    *args: str, home: Path, cwd: Path | None = None, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    exe = shutil.which(args[0])
    assert exe, f"{args[0]} is not installed on PATH"
    full_env = {**os.environ, "PERCEPTION_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None) if "MLFLOW_TRACKING_URI" not in (env or {}) else None
    return subprocess.run(
        [exe, *args[1:]], cwd=cwd or home, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def final_predictions(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "predictions" / "val_final.npz") as f:
        return {k: f[k] for k in f.files}
