"""Places and identity shared by every command (DESIGN §6): PERCEPTION_HOME, the sweep id and its
form, the sweep's directory and the file that marks a run finished, the feature cache, and the one
tracking-URI resolution. A run's own identity and directory: perception.run_id.

One rule for identities: every command that takes a sweep id checks it with `check_sweep_id` before any
work, and every place derived from one is resolved and checked by `inside` to lie under its root, so
no id, symlink or pointer read from a run directory leads a write or a read out of PERCEPTION_HOME."""

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
SWEEP_ID_RULE = (
    "expected letters, digits, '.', '_' or '-', at most 63 characters, starting with a letter or "
    "digit (no path separators, spaces, quotes or dot segments)"
)


def perception_home() -> Path:
    """`PERCEPTION_HOME` (default `./perception-home`), made absolute once so that nothing
    depends on the working directory afterwards."""
    return Path(os.environ.get("PERCEPTION_HOME", DEFAULT_HOME)).expanduser().resolve()


def cache_dir(home: Optional[Path] = None) -> Path:
    return (home or perception_home()) / "cache"


def runs_root(home: Optional[Path] = None) -> Path:
    return (home or perception_home()) / "runs"


def sweep_dir(sweep_id: str, home: Optional[Path] = None) -> Path:
    """runs/<sweep_id>/: the sweep's run directories and its lock."""
    root = runs_root(home)
    return inside(root / check_sweep_id(sweep_id), root, f"sweep_id {sweep_id!r}")


def inside(path: Path, root: Path, what: str) -> Path:
    """`path` when, resolved (symlinks and '..' followed), it lies under `root` resolved; a ConfigError
    naming `what` and both places otherwise. The path is returned as given: a root that is a symlink to
    another disk keeps its name in messages."""
    real, real_root = Path(path).resolve(), Path(root).resolve()
    if real != real_root and real_root not in real.parents:
        raise ConfigError(f"{what}: {path} resolves to {real}, outside {real_root}; expected a place under it")
    return Path(path)


def new_sweep_id() -> str:
    return "sweep-" + uuid.uuid4().hex[:10]


def check_sweep_id(sweep_id: Optional[str], where: str = "sweep_id") -> str:
    """`sweep_id` when it has the form every command accepts; a ConfigError naming `where`, the value
    (a long one cut, with its length) and the rule otherwise."""
    if isinstance(sweep_id, str) and SWEEP_ID_RE.fullmatch(sweep_id):
        return sweep_id
    shown = (
        repr(sweep_id)
        if not isinstance(sweep_id, str) or len(sweep_id) <= 70
        else f"{sweep_id[:60]!r}… ({len(sweep_id)} characters)"
    )
    raise ConfigError(f"{where} {shown}: {SWEEP_ID_RULE}".lstrip())


def sweep_id_option(value: str) -> str:
    """argparse's `type=` of every `--sweep-id`: a value off the rule is a usage error (exit 2) naming
    the option, the value and the rule, before the command does anything."""
    import argparse

    try:
        return check_sweep_id(value, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
