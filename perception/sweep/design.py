"""The study a sweep runs (DESIGN §7): which arms train, how many replicates, which two the gate compares,
the runs that follow (arm x fold x replicate), and the gate plan its parent run pre-registers before any
training. Checked from the command line before anything runs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Optional, Sequence

from perception.arms import DEFAULT_ARMS, DEFAULT_CONTROL, DEFAULT_TREATMENT, TWIN_SUFFIX, get_arm, parse_arms
from perception.errors import ConfigError
from perception.gate.sequential import DEFAULT_MAX_REPLICATES, DESIGNS, FIXED, SEQUENTIAL
from perception.run_id import RunId


@dataclass(frozen=True)
class Design:
    """Which arms train, how many replicates, and which two the gate compares. A sequential study trains
    its replicates wave by wave, up to `replicates`, and stops at the first look the gate settles."""

    arms: tuple[str, ...] = DEFAULT_ARMS
    replicates: int = 1
    control: str = DEFAULT_CONTROL
    treatment: str = DEFAULT_TREATMENT
    kind: str = FIXED  # fixed | sequential

    @property
    def sequential(self) -> bool:
        return self.kind == SEQUENTIAL

    @classmethod
    def of(
        cls,
        arms: Optional[str] = None,
        replicates: int = 1,
        aa: bool = False,
        control: Optional[str] = None,
        treatment: Optional[str] = None,
        kind: str = FIXED,
    ) -> "Design":
        """From the command line: `--aa` trains the control against its twin (the A/A test)."""
        if kind not in DESIGNS:
            raise ConfigError(f"--design {kind!r}: expected one of {list(DESIGNS)}")
        flag = "--max-replicates" if kind == SEQUENTIAL else "--replicates"
        if replicates < 1:
            raise ConfigError(f"{flag} {replicates}: expected 1 or more")
        return dataclasses.replace(cls._arms(arms, replicates, aa, control, treatment), kind=kind)

    @classmethod
    def _arms(
        cls, arms: Optional[str], replicates: int, aa: bool, control: Optional[str], treatment: Optional[str]
    ) -> "Design":
        if aa:
            # the workflow always passes its `arms` parameter: the default list means "not chosen"
            if (arms and parse_arms(arms) != DEFAULT_ARMS) or treatment:
                raise ConfigError("--aa trains the control against its twin: drop --arms and --treatment")
            control = control or DEFAULT_CONTROL
            get_arm(control)
            return cls((control, control + TWIN_SUFFIX), replicates, control, control + TWIN_SUFFIX)
        names = parse_arms(arms) if arms else DEFAULT_ARMS
        control, treatment = control or DEFAULT_CONTROL, treatment or DEFAULT_TREATMENT
        for flag, name in (("--control", control), ("--treatment", treatment)):
            if name not in names:
                raise ConfigError(f"{flag} {name!r} is not among the sweep's arms {list(names)}")
        if control == treatment:
            raise ConfigError(f"--control and --treatment are both {control!r}: expected two different arms")
        return cls(tuple(names), replicates, control, treatment)


def study_runs(sweep_id: str, n_folds: int, arms: Sequence[str] = DEFAULT_ARMS, replicates: int = 1) -> list[RunId]:
    """Replicate- then fold-major, so with several GPUs the arms of a fold train side by side."""
    return [RunId(sweep_id, a, f, r) for r in range(replicates) for f in range(n_folds) for a in arms]


def plan_tags(design: Design, gate_config: str, overrides: Sequence[str] = ()) -> dict[str, str]:
    """The gate plan the parent run records before any training (pre-registration)."""
    from perception.gate.config import load_gate_config
    from perception.gate.study import PLAN_TAG, gate_plan

    plan = gate_plan(
        load_gate_config(gate_config, overrides),
        design.control,
        design.treatment,
        list(design.arms),
        design.replicates,
        design.kind,
    )
    return {PLAN_TAG: json.dumps({**plan, "config": gate_config}, sort_keys=True)}


def replicates_flag(kind: str, replicates: Optional[int], max_replicates: Optional[int]) -> int:
    """A fixed design takes --replicates (default 1), a sequential one --max-replicates (default 3)."""
    if replicates is not None and max_replicates is not None:
        raise ConfigError(
            f"--replicates {replicates} and --max-replicates {max_replicates} cannot be combined: "
            f"--design fixed takes --replicates, --design sequential takes --max-replicates"
        )
    if kind == SEQUENTIAL and replicates is not None:
        raise ConfigError(
            f"--design sequential takes --max-replicates (the most waves it may train, default "
            f"{DEFAULT_MAX_REPLICATES}), not --replicates {replicates}"
        )
    if kind != SEQUENTIAL and max_replicates is not None:
        raise ConfigError(
            f"--max-replicates {max_replicates} needs --design sequential; --design fixed takes --replicates"
        )
    if kind == SEQUENTIAL:
        return DEFAULT_MAX_REPLICATES if max_replicates is None else max_replicates
    return 1 if replicates is None else replicates
