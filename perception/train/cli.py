"""`perception-train [overrides]`: a thin Hydra entry over `train(cfg)`. Exit codes: 0 success,
1 failed work, 2 usage or config error (DESIGN §7)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from perception.errors import ConfigError, PerceptionError
from perception.train.config import register_configs

register_configs()

PROG = "perception-train"


def compose_config(overrides: list[str]) -> DictConfig:
    """The same config `perception-train` would run with (used by other commands and tests)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="perception.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def config_error_message(exc: BaseException) -> str:
    """Hydra wraps the useful part (the key and the allowed values) in the exception's cause."""
    parts, seen = [], exc
    while seen is not None:
        text = str(seen).strip()
        if text and text not in parts:
            parts.append(text)
        seen = seen.__cause__ or seen.__context__
    return ": ".join(parts)


def run_task(cfg: DictConfig) -> dict:
    from perception.train.loop import train

    try:
        return train(OmegaConf.to_object(cfg))
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except PerceptionError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        sys.exit(1)


@hydra.main(version_base="1.3", config_path="pkg://perception.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    run_task(cfg)


def _precheck(args: list[str]) -> None:
    """Composition errors (unknown variant, wrong type) exit 2 before Hydra starts a run."""
    if any(a in ("-m", "--multirun", "-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i") or
           a.startswith(("--", "-")) for a in args):
        return
    overrides = [a for a in args if not a.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    try:
        cfg = compose_config(overrides)
        OmegaConf.to_object(cfg)
    except Exception as exc:  # composition or validation: the message names the key and allowed values
        print(f"{PROG}: config error: {config_error_message(exc)}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    _precheck(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    main()
