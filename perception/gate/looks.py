"""The gate at a look of a sequential study (DESIGN §7): every complete replicate wave is a look; each look
is decided again from its own replicates (the same block bootstrap, so the same numbers as when it was first
decided) and the pre-registered boundaries (perception.gate.sequential) say where the study stops.

The main comparison and, in a three-arm sweep, the attribution each settle at their first look that crosses a
boundary; the study stops when both have settled, or at the last look. Its decision is the main comparison's
at the look where that settled; while either is unsettled before the last look the decision is `continue`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from perception.gate.config import GateConfig
from perception.gate.decision import GateResult, resample
from perception.gate.inputs import GateRefusal, SweepInputs
from perception.gate.sequential import (
    CONTINUE,
    INCONCLUSIVE,
    KEEP,
    SHIP,
    Boundaries,
    LookVerdict,
    look_verdict,
    repeated_interval,
    settle,
)
from perception.gate.study import Study, attribution_verdict, study_result
from perception.rounds import ahead_counts, rounds_used


@dataclass
class SequentialOutcome:
    look: int  # the complete waves found (capped at max_looks)
    max_looks: int
    stopped_at: Optional[int]  # the look where the study stopped, None while it continues
    study: Study  # at the stopping look, else at the current one, with the sequential decision
    looks: list[dict] = field(default_factory=list)  # one row per look, for the report
    why: str = ""
    next_wave: Optional[dict] = None  # what the next wave trains, while the study continues


def waves_of(inputs: SweepInputs, max_looks: int) -> int:
    """The complete replicate waves 0, 1, … the sweep has; a gap (a wave missing) is refused."""
    reps = inputs.replicates
    if reps != list(range(len(reps))):
        raise GateRefusal(
            [
                f"a sequential study trains replicates 0, 1, … wave by wave; this sweep has replicates "
                f"{reps}: a wave is missing"
            ]
        )
    return min(len(reps), max_looks)


def restrict(inputs: SweepInputs, looks: int) -> SweepInputs:
    """The sweep as it stood after `looks` waves: replicates 0 … looks − 1."""
    return dataclasses.replace(
        inputs, runs={k: r for k, r in inputs.runs.items() if k[2] < looks}, replicates=list(range(looks))
    )


def sequential_study(
    inputs: SweepInputs, cfg: GateConfig, control: str, treatment: str, bounds: Boundaries, progress: bool = True
) -> SequentialOutcome:
    K = bounds.max_looks
    found = waves_of(inputs, K)
    boot = resample(restrict(inputs, found), cfg, progress)  # the blocks do not depend on the replicates
    main, attr, studies = [], [], []
    for k in range(1, found + 1):
        study = study_result(restrict(inputs, k), cfg, control, treatment, progress=False, boot=boot)
        studies.append(study)
        main.append(_look_verdict(study.main, k, bounds, cfg.noise_floor))
        if study.attribution is not None:
            attr.append(_look_verdict(study.attribution, k, bounds, cfg.noise_floor))
        if _stopped(main, attr, has_attr=study.attribution is not None):
            break
    k_now = len(main)
    stop_main, stop_attr = settle(main), settle(attr) if attr else None
    stopped = _stopped(main, attr, has_attr=bool(attr))
    study = studies[k_now - 1]
    if stopped:  # each comparison as it stood at the look where it settled
        assert stop_main is not None  # stopped: the main comparison has settled
        study.main = _apply(studies[stop_main.look - 1].main, stop_main, control, treatment)
        if stop_attr is not None:
            attribution = studies[stop_attr.look - 1].attribution
            assert attribution is not None  # it settled at a look that decided it
            study.attribution = _apply(attribution, stop_attr, attribution.control, attribution.treatment)
            study.verdict = attribution_verdict(study.attribution, study.main)
        why = stop_main.reason + (f"; attribution settled at {stop_attr.reason}" if stop_attr else "")
        next_wave = None
    else:
        unsettled = ["the decision"] * (stop_main is None) + ["the attribution"] * (bool(attr) and stop_attr is None)
        why = f"look {k_now} of {K}: {' and '.join(unsettled)} crossed no boundary: the next wave trains" + (
            f" ({stop_main.reason})" if stop_main else ""
        )
        study.main.decision = CONTINUE
        study.main.reasons.insert(0, why)
        next_wave = {
            "replicate": k_now,
            "arms": list(inputs.arms),
            "folds": list(range(inputs.n_folds)),
            "trainings": len(inputs.arms) * inputs.n_folds,
        }
    rows = [_look_row(studies[v.look - 1], v, attr[v.look - 1] if len(attr) >= v.look else None, bounds) for v in main]
    return SequentialOutcome(found, K, k_now if stopped else None, study, rows, why, next_wave)


def _look_verdict(result: GateResult, look: int, bounds: Boundaries, noise_floor: float) -> LookVerdict:
    rule1, rule2 = result.rules  # rule 1 (W) and rule 2 (G)
    return look_verdict(rule1, rule2, look, bounds, noise_floor)


def _stopped(main: list[LookVerdict], attr: list[LookVerdict], has_attr: bool) -> bool:
    return settle(main) is not None and (not has_attr or settle(attr) is not None)


def _apply(result: GateResult, verdict: LookVerdict, control: str, treatment: str) -> GateResult:
    """The comparison at the look where it settled, with that look's sequential decision and levels."""
    result.decision = {SHIP: f"ship_{treatment}", KEEP: f"keep_{control}", INCONCLUSIVE: "inconclusive"}[
        verdict.verdict
    ]
    result.rules = verdict.rules
    result.rule = verdict.rule
    result.p = next((r.p_bootstrap for r in verdict.rules if r.name == verdict.rule), verdict.rules[0].p_bootstrap)
    result.reasons.insert(0, f"sequential: {verdict.reason}")
    return result


def _look_row(study: Study, v: LookVerdict, a: Optional[LookVerdict], bounds: Boundaries) -> dict:
    r1, r2 = v.rules
    decider = next((r for r in v.rules if r.name == v.rule), r1)
    lo, hi = repeated_interval(decider.lift, decider.se, decider.df, v.level)
    row = {
        "look": v.look,
        "replicates": v.look,
        "W": study.main.W,
        "G": study.main.G,
        "p_W": r1.p_bootstrap,
        "p_G": r2.p_bootstrap,
        "level_W": r1.level,
        "level_G": r2.level,
        "efficacy_alpha": v.level,
        "futility_p": bounds.futility[v.look - 1],
        "verdict": v.verdict,
        "rule": v.rule,
        "reason": v.reason,
        "lift": decider.lift_name,
        "repeated_ci": [lo, hi],
        "attribution_verdict": a.verdict if a else None,
        "evidence": r1.variance,
    }
    return {k: _finite_or_none(x) for k, x in row.items()}


def _finite_or_none(x):
    """report.json is strict JSON: a NaN (no p, no interval) is written as null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, list):
        return [_finite_or_none(y) for y in x]
    return x


def cost(looks_used: int, max_looks: int, trainings_per_wave: int, gpus: int = 6) -> dict:
    """Trainings and GPU rounds used against the fixed design's (all max_looks waves at once); a wave's idle
    GPUs train the next wave's first trainings (`rounds.rounds_used`), counted in the rounds they took."""
    return {
        "trainings": looks_used * trainings_per_wave,
        "fixed_trainings": max_looks * trainings_per_wave,
        "gpu_rounds_on_6": rounds_used(trainings_per_wave, gpus, looks_used, max_looks),
        "trained_ahead_on_6": ahead_counts(trainings_per_wave, gpus, max_looks)[looks_used - 1] if looks_used else 0,
        "fixed_gpu_rounds_on_6": math.ceil(max_looks * trainings_per_wave / gpus),
    }
