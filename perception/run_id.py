"""A training run's identity (DESIGN §6): its sweep, arm, fold and replicate, and every name derived from
them, declared once: its directory under PERCEPTION_HOME, its run name, its MLflow tags, its item in the
workflow's fan-out, its Hydra overrides and the gate's (arm, fold, replicate) key.

Derived, never timestamped: a retried pod finds its checkpoint, a re-run its finished run. Replicate 0
keeps the names runs had before replicates existed (no `-r0`, no "replicate 0")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from perception.contract import FOLD, REPLICATE, ROLE, ROLE_TRAIN, SWEEP_ID, VARIANT
from perception.paths import inside, sweep_dir

RunKey = tuple[str, int, int]  # (arm, fold, replicate): a run within one sweep, as the gate groups them
FOLD_SEED_STRIDE = 100_003  # far above any replicate count, far below the reseeded arms' offset


def run_seed(seed: int, fold: int, replicate: int) -> int:
    """The seed a run trains from (init and batch order): `seed + replicate + FOLD_SEED_STRIDE·fold`.
    Each (fold, replicate) starts from its own init, so the gate's cells are independent draws of the
    training noise; with one init for every fold, the init's luck would be common to the folds and
    neither the folds' spread nor se²_training = s²/(F·R) would see it (DESIGN §7)."""
    return int(seed) + int(replicate) + FOLD_SEED_STRIDE * int(fold)


def run_name(arm: str, fold: int, replicate: int = 0) -> str:
    """A run's name (its directory's and its MLflow run's), also read off a workflow step's inputs."""
    return f"{arm}-f{fold}" + (f"-r{replicate}" if replicate else "")


@dataclass(frozen=True)
class RunId:
    sweep_id: str
    arm: str  # MLflow tag `variant`
    fold: int
    replicate: int = 0

    @property
    def name(self) -> str:
        return run_name(self.arm, self.fold, self.replicate)

    @property
    def label(self) -> str:
        """How messages name the run within its sweep."""
        return f"{self.arm} fold {self.fold}" + (f" replicate {self.replicate}" if self.replicate else "")

    @property
    def key(self) -> RunKey:
        return (self.arm, self.fold, self.replicate)

    def seed(self, base: int) -> int:
        """This run's seed in a sweep whose seed is `base`."""
        return run_seed(base, self.fold, self.replicate)

    def directory(self, home: Optional[Path] = None) -> Path:
        """runs/<sweep_id>/<name>/, checked to lie under the sweep's directory."""
        root = sweep_dir(self.sweep_id, home)
        return inside(root / self.name, root, f"the run directory of sweep {self.sweep_id!r}")

    def tags(self) -> dict[str, str]:
        """The tags a training run starts with (its parent's id is added where known)."""
        return {
            SWEEP_ID: self.sweep_id,
            VARIANT: self.arm,
            FOLD: str(self.fold),
            REPLICATE: str(self.replicate),
            ROLE: ROLE_TRAIN,
        }

    def overrides(self) -> list[str]:
        """The trainer's Hydra overrides that select this run (the sweep_id is passed beside them)."""
        return [f"arm={self.arm}", f"data.fold={self.fold}", f"replicate={self.replicate}"]

    def fan_out_item(self) -> dict[str, str]:
        """The workflow's item for this run (withParam): the train template's parameters."""
        return {"arm": self.arm, "fold": str(self.fold), "replicate": str(self.replicate)}

    def wave_item(self) -> dict[str, str]:
        """A sequential study's wave item: the wave template adds its own replicate."""
        return {"arm": self.arm, "fold": str(self.fold)}
