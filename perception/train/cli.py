"""`perception-train [overrides]`: a thin Hydra entry over `train(cfg)`. Exit codes: 0 success,
1 failed work, 2 usage or config error (DESIGN §7) or the run is being trained by another process
(its holder named), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

SIGTERM (a pod being deleted or preempted, `kill`) raises Terminated, a KeyboardInterrupt, so the
run records its end as KILLED and uploads its log before the process exits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from perception.errors import ConfigError, PerceptionError
from perception.exits import exit_code, raise_on_sigterm
from perception.paths import check_sweep_id, inside, perception_home
from perception.train.compose import CONFIG_NAME, compose_config, composed, config_error_message, keep_gate_name
from perception.train.config import Config
from perception.train.override_keys import check_override_keys

PROG = "perception-train"
STOPPED = "the run is recorded as KILLED; the same command resumes it from its last checkpoint"


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def run_task(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from perception.train.loop import train

    if HydraConfig.initialized():  # as `composed` gives it: the chosen gate config's name
        keep_gate_name(cfg, HydraConfig.get().runtime.choices)
    try:
        return train(cast(Config, OmegaConf.to_object(cfg)), _overrides())  # a structured config: its dataclass
    except (PerceptionError, KeyboardInterrupt) as exc:  # a held run lock exits 2: nothing was touched
        sys.exit(exit_code(exc, PROG, stopped=STOPPED))


@hydra.main(version_base="1.3", config_path="pkg://perception.conf", config_name=CONFIG_NAME)
def _hydra_main(cfg: DictConfig) -> None:
    run_task(cfg)


def _precheck(args: list[str]) -> None:
    """Before Hydra starts a run (and makes its output directory): unknown keys and options, the sweep
    ids (every value of a multirun's), Hydra's output directories, then composition and the config's
    checks (one run only; each job of a multirun checks its own). Any error exits 2 having written
    nothing."""
    if any(a in ("-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i") for a in args):
        return
    multirun = any(a in ("-m", "--multirun") for a in args)
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return  # another of Hydra's flags: Hydra says what it makes of it
    overrides = [a for a in args if not a.startswith("-")]
    try:
        check_override_keys(overrides, Config)  # a multirun's swept values too
        check_places(overrides)
        if not multirun:
            from perception.train.validate import check_config

            cfg = composed([o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))])
            if cfg.sweep_id is not None:  # set by an experiment's file, say
                check_sweep_id(cfg.sweep_id)
            check_config(cfg)
    except ConfigError as exc:  # composition or validation: the message names the key and allowed values
        sys.exit(exit_code(exc, PROG))


def check_places(overrides: list[str]) -> None:
    """Every sweep id the overrides name, and Hydra's run and multirun directories, as they resolve
    with these overrides: under PERCEPTION_HOME, where the config puts them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # Hydra's grammar error: the message quotes the override
        raise ConfigError(config_error_message(exc)) from None
    for o in parsed:
        if o.key_or_group == "sweep_id":
            try:
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            except Exception as exc:  # glob(): Hydra globs config groups' options, never a value like this
                raise ConfigError(f"{o.input_line}: expected sweep ids, listed ({config_error_message(exc)})") from None
            for value in values:
                if value is not None:
                    check_sweep_id(str(value))
    single = [o.input_line or "" for o in parsed if not o.is_sweep_override()]  # the parser keeps each line
    try:
        hydra = compose_config(single, with_hydra=True).hydra
    except Exception as exc:
        raise ConfigError(config_error_message(exc)) from None
    home = perception_home()
    with open_dict(hydra):
        hydra.job.num = 0  # a multirun job's number, which the job's subdir names by default
    jobs = [Path(hydra.run.dir), Path(hydra.sweep.dir) / str(hydra.sweep.subdir)]
    for key, place in (("hydra.run.dir", hydra.run.dir), ("hydra.sweep.dir", hydra.sweep.dir)):
        inside(Path(place), home, f"{key}={place}")
    inside(jobs[1], home, f"hydra.sweep.subdir={hydra.sweep.subdir} in hydra.sweep.dir")
    if hydra.output_subdir is not None:
        for job in jobs:
            inside(job / hydra.output_subdir, home, f"hydra.output_subdir={hydra.output_subdir} in {job}")


def main() -> None:
    raise_on_sigterm()
    _precheck(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
