"""`perception-sweep calibrate`: measure an experiment's training noise with A/A sweeps and write the
noise file the gate adds to one-replicate evidence (DESIGN §7): $PERCEPTION_HOME/noise/<experiment>.json,
which the gate reads before the files shipped in the package; `into_package` (`--into-package`) writes
perception/gate/noise/<experiment>.json instead, for a maintainer refreshing the shipped files.

Each seed arm (shared, per_horizon) is trained against its twin in `sweeps` A/A sweeps on seeds of their
own (`seed_base + k`, each with its own synthetic book): every (sweep, fold) gives one cell of
AUC differences under no effect, and the file keeps their per-horizon covariance with where and on what
it was measured. A re-run with the same arguments resumes: finished trainings are skipped. With
`write=False` (`--no-write`) only the sweeps are trained and decided, so the sweeps can run apart (the
workflow's `-p calibrate=true` runs one per pod) and one later call without it writes the file from them
all, training nothing.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from perception.arms import TWIN_SUFFIX
from perception.atomic import atomic_write_text
from perception.errors import ConfigError, PerceptionError

SEED_ARMS = ("shared", "per_horizon")
SEED_BASE = 90_000  # apart from the seeds studies/validity.py measures false-ship rates with


def calibrate(
    experiment: str,
    sweeps: int,
    overrides: Sequence[str] = (),
    *,
    cpu_workers: int = 1,
    seed_base: int = SEED_BASE,
    out: Optional[Path] = None,
    arms: Sequence[str] = SEED_ARMS,
    write: bool = True,
    into_package: bool = False,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> Optional[Path]:
    """Runs the A/A sweeps and writes the noise file; returns its path (None with `write` off)."""
    from perception.sweep.design import Design
    from perception.sweep.local import run_local_sweep

    for arm in arms:
        if arm not in SEED_ARMS:
            raise ConfigError(f"--arms {','.join(arms)}: {arm!r} is not a seed arm; expected some of {list(SEED_ARMS)}")
    path = noise_file_path(experiment, out, into_package)  # a bad request is said before any training
    if sweeps < 1:
        raise ConfigError(f"--sweeps {sweeps}: expected 1 or more A/A sweeps per seed arm")
    for o in overrides:
        if o.split("=", 1)[0].lstrip("+~") in ("experiment", "seed", "data.synthetic_seed"):
            raise ConfigError(f"override {o!r}: calibrate sets experiment (--experiment) and each sweep's seeds")
    cells: dict[str, list[np.ndarray]] = {}
    ids: list[tuple[str, Optional[str]]] = []  # (sweep id, its git sha)
    for arm in arms:
        for k in range(sweeps):
            seed = seed_base + k
            sweep_id = f"calibrate-{experiment}-{arm}-{seed}".replace("_", "-")
            say(f"calibrate: A/A sweep {len(ids) + 1}/{len(arms) * sweeps}: {arm} against its twin, seed {seed}")
            result = run_local_sweep(
                sweep_id,
                [f"experiment={experiment}", f"seed={seed}", f"data.synthetic_seed={seed}", *overrides],
                design=Design.of(aa=True, control=arm),
                cpu_workers=cpu_workers,
            )
            gate = result.gate
            if gate is None or gate.refused:
                raise PerceptionError(
                    f"calibrate: A/A sweep {sweep_id} has no decision ("
                    + "; ".join(getattr(gate, "reasons", None) or ["no gate"])
                    + "); fix it and re-run the same command to resume"
                )
            auc = gate.summary["auc"]
            cells.setdefault(arm, []).append(
                np.asarray(auc[arm + TWIN_SUFFIX]["per_fold"]) - np.asarray(auc[arm]["per_fold"])
            )  # (F, H)
            ids.append((sweep_id, gate.summary.get("params", {}).get("git_sha")))
    if not write:
        say(f"calibrate: {len(ids)} A/A sweep(s) decided; no noise file written (--no-write)")
        return None
    doc = noise_document(
        experiment,
        overrides,
        {a: np.concatenate(c) for a, c in cells.items()},
        seeds=[seed_base, seed_base + sweeps - 1],
        sweeps=ids,
        n_sweeps=sweeps,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    say(f"calibrate: wrote {path}: " + ", ".join(f"{a}: {m['n_cells']} cells" for a, m in doc["arms"].items()))
    return path


def noise_file_path(experiment: str, out: Optional[Path] = None, into_package: bool = False) -> Path:
    """Where the noise file goes: `out` when given; with `into_package` the shipped folder in the installed
    package; else the folder of one's own the gate reads first ($PERCEPTION_HOME/noise)."""
    from perception.gate.noise import noise_dir, shipped_dir

    if out is not None and into_package:
        raise ConfigError(f"--out {out} and --into-package: expected one place to write the noise file, not both")
    if out is not None:
        return Path(out)
    return (shipped_dir() if into_package else noise_dir()) / f"{experiment}.json"


def noise_document(
    experiment: str,
    overrides: Sequence[str],
    deltas: dict[str, np.ndarray],
    seeds: list[int],
    sweeps: list[tuple[str, Optional[str]]],
    n_sweeps: int,
) -> dict:
    """The noise file: what it applies to (`match`), the cells' covariance per arm, and its provenance."""
    from perception.gate.noise import MATCH_KEYS, measure
    from perception.train.compose import composed
    from perception.train.params import flatten_config

    cfg = composed([f"experiment={experiment}", *overrides])
    params = {**flatten_config(cfg), "experiment": str(cfg.experiment_name)}
    extra = " " + " ".join(overrides) if overrides else ""
    return {
        "match": {k: params[k] for k in MATCH_KEYS},
        "horizons": list(cfg.data.horizons),
        "arms": measure(deltas),
        "source": (
            f"perception-sweep calibrate --experiment {experiment} --sweeps {n_sweeps}"
            f"{extra}: A/A sweeps (each seed arm against its twin), seeds {seeds[0]}..{seeds[1]}"
        ),
        "measured": {
            "host": platform.node(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "overrides": list(overrides),
            "sweeps": [s for s, _ in sweeps],
            "git_sha": sorted({g for _, g in sweeps if g}),
        },
    }
