"""Trainer, tracking and root configuration; registered with Hydra's ConfigStore."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from perception.data.config import DataConfig
from perception.arms import ARM_FIELDS, RESEED_OFFSET, Arm, choose_arm
from perception.model.config import ModelConfig
from perception.paths import MLFLOW_EXPERIMENT
from perception.train.precision import Precision


class ResumeMode(str, Enum):
    auto = "auto"  # continue from the run directory's last good checkpoint, if any
    never = "never"  # refuse to start over an existing checkpoint


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class TrainerConfig:
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.05  # of all optimizer steps
    grad_clip: float = 1.0
    # learning-rate multiplier of the pool query, every arm alike: with Qw ~ N(0, 1/D) the scores start
    # near 0, and at the base rate the queries move ~10 % of their norm in a `local` training, too
    # little to single out a few snapshots of a window (attention stays near uniform)
    query_lr_scale: float = 1.0
    precision: Precision = Precision.tf32  # fp32 | tf32 | bf16 (perception/train/precision.py)
    max_train_batches: Optional[int] = None  # per epoch; None: every training window
    horizon_weights: Optional[list[float]] = None  # loss weights per horizon; None: equal
    device: Device = Device.auto
    num_threads: Optional[int] = None  # torch CPU threads; None: torch's default
    resume: ResumeMode = ResumeMode.auto
    init_from: Optional[str] = None  # warm-start the common trunk from a V1/V2 checkpoint
    progress: bool = True


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # else MLFLOW_TRACKING_URI, else sqlite under PERCEPTION_HOME
    experiment: str = MLFLOW_EXPERIMENT
    parent_run_id: Optional[str] = None
    # MLflow's system/… metrics (CPU, memory; GPU where present), sampled every 10 s in a thread
    system_metrics: bool = True


@dataclass
class Config:
    seed: int = 0
    sweep_id: Optional[str] = None  # None: a fresh id
    # the run's arm, the way to choose the model's configuration (perception/arms.py: shared, per_horizon,
    # shared_skip, <arm>_twin, <arm>_reseed); it sets model.attention_pool, shared_context_to_heads and
    # twin. None: the arm those fields name where given (model.attention_pool=per_horizon), else shared
    arm: Optional[str] = None
    # replicate r of a (arm, fold) trains with seed + r: every arm of a replicate shares the trunk's
    # init and batch order, replicates differ in both (tag `replicate`, run directory `-r<r>`)
    replicate: int = 0
    experiment_name: Optional[str] = None  # set by conf/experiment/<name>.yaml; MLflow param `experiment`
    # the gate config the experiment's defaults choose (`- override /gate: NAME`): Hydra composes
    # conf/gate/NAME.yaml's content here, and the compose keeps its name, NAME (perception.train.compose
    # `gate_choice`), for the sweep to decide with; None: the experiment chose none
    gate: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="data", name="base_data", node=DataConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="trainer", name="base_trainer", node=TrainerConfig)
    cs.store(group="tracking", name="base_tracking", node=TrackingConfig)


def chosen_arm(cfg: Config) -> Arm:
    """The arm `cfg` chooses (`arm=NAME`, or the model fields alone); a ConfigError where they disagree."""
    return choose_arm(cfg.arm, {key: getattr(cfg.model, key) for key in ARM_FIELDS})


def apply_arm(cfg: Config) -> str:
    """Sets the model fields of the arm `cfg` chooses; returns its name, which is the run's MLflow
    `variant` tag and names its run directory (so arms never share one)."""
    arm = chosen_arm(cfg)
    for key, value in arm.model_fields().items():
        setattr(cfg.model, key, value)
    if arm.reseed:  # the logged seed says so; the gate exempts reseeded arms from seed agreement
        cfg.seed = int(cfg.seed) + RESEED_OFFSET
    cfg.arm = arm.name
    return arm.name
