"""Config checks that run before any work: each error names the key, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from perception.enums import enum_value
from perception.errors import CheckpointError, ConfigError
from perception.train.config import Config, ResumeMode, chosen_arm

if TYPE_CHECKING:
    import torch


def check_config(cfg: Config) -> None:
    """Every check that needs no run directory: run before one is made, so a refused start leaves none."""
    from perception.model.checkpoint import read_checkpoint_variant

    check_values(cfg)
    t = cfg.trainer
    if t.init_from is not None:
        path = Path(t.init_from).expanduser()
        if not path.is_file():
            raise ConfigError(f"trainer.init_from={t.init_from}: no such checkpoint file")
        read_checkpoint_variant(path)  # readable V1/V2 checkpoint of either variant
    resolve_device(t.device)


def check_values(cfg: Config) -> None:
    """The values' own checks, which hold on any machine (no device, no checkpoint file): a sweep runs
    them once before it starts anything."""
    from perception.data import check_data_config

    check_data_config(cfg.data)
    chosen_arm(cfg)  # an unknown arm, or model fields that disagree with it
    t = cfg.trainer
    _positive("trainer.epochs", t.epochs)
    _positive("trainer.batch_size", t.batch_size)
    _positive("trainer.eval_batch_size", t.eval_batch_size)
    if t.max_train_batches is not None:
        _positive("trainer.max_train_batches", t.max_train_batches)
    if not t.lr > 0:
        raise ConfigError(f"trainer.lr={t.lr}: expected a positive learning rate")
    if not 0 <= t.warmup_frac < 1:
        raise ConfigError(f"trainer.warmup_frac={t.warmup_frac}: expected a fraction in [0, 1)")
    if not t.query_lr_scale > 0:
        raise ConfigError(f"trainer.query_lr_scale={t.query_lr_scale}: expected a positive multiplier")
    if not t.grad_clip > 0:
        raise ConfigError(f"trainer.grad_clip={t.grad_clip}: expected a positive norm")
    n_h = len(cfg.data.horizons)
    if t.horizon_weights is not None and len(t.horizon_weights) != n_h:
        raise ConfigError(
            f"trainer.horizon_weights has {len(t.horizon_weights)} values: expected one per "
            f"horizon of data.horizons={list(cfg.data.horizons)}"
        )


def check_resume(cfg: Config, run_dir: Path) -> Optional[Path]:
    """The checkpoint directory to resume from, if any, once it is known to suit `cfg`."""
    from perception.model.checkpoint import read_checkpoint_variant
    from perception.train.state import latest_checkpoint

    t = cfg.trainer
    arm = chosen_arm(cfg)
    variant = arm.attention_pool.value
    resume_dir = None
    try:
        resume_dir = latest_checkpoint(run_dir)
    except CheckpointError as exc:
        raise ConfigError(f"cannot resume {run_dir}: {exc}") from exc
    if resume_dir is not None:
        if enum_value(t.resume) == ResumeMode.never.value:
            raise ConfigError(
                f"trainer.resume=never but {run_dir} already holds a checkpoint ({resume_dir.name}); "
                "use trainer.resume=auto to continue it, or another sweep_id"
            )
        _check_resumed_seed(cfg, run_dir)
        found = enum_value(read_checkpoint_variant(resume_dir / "model.safetensors"))
        if found != variant:
            raise ConfigError(
                f"cannot resume arm={arm.name} (a {variant} pool) from {resume_dir / 'model.safetensors'}: "
                f"it is a {found} checkpoint (to start a {variant} run from another variant's trunk, "
                "use trainer.init_from=PATH in a fresh run directory)"
            )
    return resume_dir


def _check_resumed_seed(cfg: Config, run_dir: Path) -> None:
    """A resumed run keeps the seed it started with (its batch order and its logged `seed`). A run started
    before each fold had its own seed (`run_id.run_seed`) has another one on every fold but 0."""
    import yaml

    from perception.train.run_record import CONFIG_FILE

    try:
        started = yaml.safe_load((run_dir / CONFIG_FILE).read_text()).get("seed")
    except (OSError, yaml.YAMLError, AttributeError):
        return  # no readable config: the checkpoint's own checks decide
    if started is not None and int(started) != int(cfg.seed):
        raise ConfigError(
            f"cannot resume {run_dir}: it started with seed {started} ({run_dir / CONFIG_FILE}), this run's seed "
            f"is {cfg.seed}; a run started before each fold had its own seed is finished by the code it started "
            "with (or start another sweep_id)"
        )


def resolve_device(device) -> "torch.device":
    import torch

    name = enum_value(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=auto or cpu")
    return torch.device(name)


def _positive(key: str, value) -> None:
    if not (isinstance(value, int) and value >= 1):
        raise ConfigError(f"{key}={value}: expected a positive integer")
