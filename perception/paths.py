"""Places and identity shared by every command (DESIGN §6): PERCEPTION_HOME, the sweep id and its
form, run directories and the file that marks one finished, the feature cache, and the one
tracking-URI resolution."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Optional

from perception.errors import ConfigError

DEFAULT_HOME = "perception-home"
MLFLOW_EXPERIMENT = "perception-ab"  # every command's default MLflow experiment (tracking.experiment)
DONE_FILE = "done.json"  # in a run directory once its training finished: a re-run skips it
# A directory name, an MLflow tag value that needs no quoting and an Argo label value (at most 63).
SWEEP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def perception_home() -> Path:
    """`PERCEPTION_HOME` (default `./perception-home`), made absolute once so that nothing
    depends on the working directory afterwards."""
    return Path(os.environ.get("PERCEPTION_HOME", DEFAULT_HOME)).expanduser().resolve()


def cache_dir(home: Optional[Path] = None) -> Path:
    return (home or perception_home()) / "cache"


def sweep_dir(sweep_id: str, home: Optional[Path] = None) -> Path:
    """runs/<sweep_id>/: the sweep's run directories and its lock."""
    return (home or perception_home()) / "runs" / sweep_id


def run_dir(sweep_id: str, arm: str, fold: int, home: Optional[Path] = None, replicate: int = 0) -> Path:
    """Derived from (sweep_id, arm, fold, replicate), never timestamped: a retried pod finds its
    checkpoint. Replicate 0 keeps the name runs had before replicates existed."""
    return sweep_dir(sweep_id, home) / run_name(arm, fold, replicate)


def run_name(arm: str, fold: int, replicate: int = 0) -> str:
    return f"{arm}-f{fold}" + (f"-r{replicate}" if replicate else "")


def new_sweep_id() -> str:
    return "sweep-" + uuid.uuid4().hex[:10]


def check_sweep_id(sweep_id: Optional[str], where: str = "sweep_id") -> str:
    """`sweep_id` when it has the form every command accepts; a ConfigError naming `where` otherwise."""
    if not SWEEP_ID_RE.fullmatch(sweep_id or ""):
        raise ConfigError(f"{where} {sweep_id!r}: expected letters, digits, '.', '_' or '-', "
                          f"at most 63 characters, starting with a letter or digit")
    return sweep_id


def tracking_uri(configured: Optional[str] = None, home: Optional[Path] = None) -> str:
    """`tracking.uri`, else `MLFLOW_TRACKING_URI`, else a sqlite store under PERCEPTION_HOME."""
    if configured:
        return configured
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    home = home or perception_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"
