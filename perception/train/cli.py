"""`perception-train [overrides]`: a thin Hydra entry over `train(cfg)`. Exit codes: 0 success,
1 failed work, 2 usage or config error (DESIGN §7) or the run is being trained by another process
(its holder named), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

SIGTERM (a pod being deleted or preempted, `kill`) raises Terminated, a KeyboardInterrupt, so the
run records its end as KILLED and uploads its log before the process exits."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from perception.errors import ConfigError, PerceptionError
from perception.exits import exit_code, raise_on_sigterm
from perception.train.compose import CONFIG_NAME, composed

PROG = "perception-train"
STOPPED = "the run is recorded as KILLED; the same command resumes it from its last checkpoint"


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def run_task(cfg: DictConfig) -> dict:
    from perception.train.loop import train

    try:
        return train(OmegaConf.to_object(cfg), _overrides())
    except (PerceptionError, KeyboardInterrupt) as exc:  # a held run lock exits 2: nothing was touched
        sys.exit(exit_code(exc, PROG, stopped=STOPPED))


@hydra.main(version_base="1.3", config_path="pkg://perception.conf", config_name=CONFIG_NAME)
def _hydra_main(cfg: DictConfig) -> None:
    run_task(cfg)


def _precheck(args: list[str]) -> None:
    """Composition errors (unknown variant, wrong type) exit 2 before Hydra starts a run."""
    if any(a in ("-m", "--multirun", "-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i") or
           a.startswith(("--", "-")) for a in args):
        return
    overrides = [a for a in args if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    try:
        composed(overrides)
    except ConfigError as exc:  # composition or validation: the message names the key and allowed values
        sys.exit(exit_code(exc, PROG))


def main() -> None:
    raise_on_sigterm()
    _precheck(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
