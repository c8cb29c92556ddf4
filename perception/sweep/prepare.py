"""The workflow's first step (`perception-sweep prepare`, DESIGN §7): the feature cache and the sweep's
parent run with its pre-registered gate plan, and the step's outputs: the trainings to fan out (one per
arm, fold and replicate), control, treatment, the resolved gate config and the precision and SSD every
training runs with (the ones the sweep started with, perception.sweep.pins). It holds the sweep's lock
(perception.locks) while it works, as `local` does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from perception.atomic import atomic_write_text
from perception.errors import ConfigError, PerceptionError
from perception.exits import EXIT_USAGE
from perception.locks import sweep_lock
from perception.paths import check_sweep_id, perception_home, sweep_dir, tracking_uri
from perception.rounds import ahead_counts
from perception.sweep.design import Design, plan_tags, study_runs
from perception.sweep.overrides import AUTO_GATE_CONFIG, check_overrides, resolve_gate_config
from perception.sweep.pins import PARAMETERS, composed_values, pin, started_values


def command(name: str) -> list[str]:
    found = shutil.which(name)
    if not found:
        raise PerceptionError(f"{name} is not on PATH; install the package (pip install -e .)")
    return [found]


def build_features(overrides: Sequence[str], env: dict[str, str], data_command: Optional[list[str]] = None) -> None:
    """`perception-data build`: fills the feature cache once, before trainings run side by side."""
    rc = subprocess.run([*(data_command or command("perception-data")), "build", *overrides], env=env).returncode
    if rc == EXIT_USAGE:
        raise ConfigError(f"perception-data build {' '.join(overrides)} rejected the configuration (exit 2)")
    if rc != 0:
        raise PerceptionError(f"perception-data build failed (exit {rc})")


def prepare(
    sweep_id: str,
    overrides: Sequence[str],
    parent_run_id_file: Optional[Path] = None,
    data_command: Optional[list[str]] = None,
    design: Optional[Design] = None,
    outputs: Optional[Path] = None,
    gate_config: str = AUTO_GATE_CONFIG,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    gpus: int = 6,
) -> str:
    """The feature cache plus the sweep's parent run (with its gate plan and pinned values); returns its id.
    `outputs` receives the step's output parameters as files: parent-run-id, runs (the trainings to fan
    out, JSON), wave (one wave's trainings, for a sequential study's waves), aheads (per wave, the next
    wave's trainings it runs on the GPUs its last round leaves idle of `gpus`), control, treatment,
    gate-config (`auto` resolved), and the pinned values, precision, ssd, fold-embed, chunk and fused-grn
    (what every training appends as the keys of pins.PARAMETERS)."""
    from perception.tracking import ensure_parent_run, parent_run_tags
    from perception.train.compose import composed

    design = design or Design()
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: expected the number of GPUs the trainings share, 1 or more")
    check_sweep_id(sweep_id)
    check_overrides(overrides)
    cfg = composed(overrides, checked=True)
    gate_config = resolve_gate_config(gate_config, cfg)
    uri = tracking_uri(cfg.tracking.uri)
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home())}
    with sweep_lock(sweep_dir(sweep_id), sweep_id):
        # a continued sweep keeps the values it started with (pins.py), as `local` does; refused before any work
        started = started_values(parent_run_tags(sweep_id, uri, cfg.tracking.experiment))
        overrides, notes, pinned = pin(sweep_id, started, composed_values(cfg), overrides)
        for note in notes:
            say(note)
        build_features(overrides, env, data_command)
        first_tags = {**plan_tags(design, gate_config), **pinned}
        parent = ensure_parent_run(sweep_id, uri, cfg.tracking.experiment, first_tags)
    if parent_run_id_file is not None:
        atomic_write_text(parent_run_id_file, parent)
    if outputs is not None:
        outputs.mkdir(parents=True, exist_ok=True)
        atomic_write_text(outputs / "parent-run-id", parent)
        atomic_write_text(outputs / "runs", json.dumps(fan_out(sweep_id, int(cfg.data.n_folds), design)))
        wave = wave_fan_out(sweep_id, int(cfg.data.n_folds), design)
        atomic_write_text(outputs / "wave", json.dumps(wave))
        atomic_write_text(outputs / "aheads", json.dumps(aheads(wave, design, gpus)))
        atomic_write_text(outputs / "control", design.control)
        atomic_write_text(outputs / "treatment", design.treatment)
        atomic_write_text(outputs / "gate-config", gate_config)
        for key, name in PARAMETERS.items():
            atomic_write_text(outputs / name, pinned[key])
    return parent


def fan_out(sweep_id: str, n_folds: int, design: Design) -> list[dict[str, str]]:
    """The workflow's training items (withParam): one per arm, fold and replicate."""
    return [run.fan_out_item() for run in study_runs(sweep_id, n_folds, design.arms, design.replicates)]


def wave_fan_out(sweep_id: str, n_folds: int, design: Design) -> list[dict[str, str]]:
    """One wave's training items (arm and fold): a sequential study's wave template fans out over them
    with its own replicate."""
    return [run.wave_item() for run in study_runs(sweep_id, n_folds, design.arms, 1)]


def aheads(wave: list[dict[str, str]], design: Design, gpus: int) -> list[list[dict[str, str]]]:
    """Per wave r of a sequential study, the items of wave r + 1 it trains on its idle GPUs (the workflow's
    `ahead` task; `rounds.ahead_counts`); empty for the last wave and for a fixed study."""
    if not design.sequential:
        return []
    return [wave[:n] for n in ahead_counts(len(wave), gpus, design.replicates)]
