"""The code version every run logs as `git_sha`: PERCEPTION_GIT_SHA when set (the image sets it at
build; a user pins it while a sweep runs, so commits made meanwhile do not split the sweep), else
git, else "unknown"."""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def git_sha() -> str:
    pinned = os.environ.get("PERCEPTION_GIT_SHA", "").strip()
    if pinned:
        return pinned
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"
