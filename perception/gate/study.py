"""Everything the gate says about one sweep: the decision (control → treatment), the attribution
(`shared_skip` → `per_horizon`: do per-horizon queries add lift beyond feeding pooled context to the
heads?), the context path's own effect (`shared` → `shared_skip`), the learning-signal diagnostics
with their flags, how training noise entered the evidence, and whether the gate kept to the sweep's
pre-registered plan."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perception.arms import ATTRIBUTION
from perception.gate.config import GateConfig
from perception.gate.decision import GateResult, Resamples, decide, resample
from perception.gate.evidence import MULTIPLICITY
from perception.gate.inputs import SweepInputs
from perception.gate.noise import TrainingNoise, matching_noise
from perception.gate.sequential import FIXED, plan_fields

# A pool query whose gradient is this small against the trunk's learns nothing (DESIGN §3: the CfC
# forgets h_0 within tens of steps, so the shared query's gradient vanishes in fp32).
NO_SIGNAL_RATIO = 1e-6
# Mean pairwise Jensen–Shannon divergence (nats, at most ln 2) between per-horizon queries' attention
# over a window below which they did not specialise: between random queries' near-uniform attention
# and queries that look at different events (the figures: docs/validity.md "What was kept, and why").
MIN_DIVERGENCE = 0.01
# Attention entropy over the window's positions, as a fraction of the uniform's (1 = uniform): at or
# above this the queries stayed near uniform, as a pool query without learning signal does; learned
# queries sit well below (the ranges: docs/validity.md "What was kept, and why").
NEAR_UNIFORM = 0.95
TRUNK_GROUPS = ("grad_norm_vsn", "grad_norm_mamba", "grad_norm_cfc")
PLAN_TAG = "gate_plan"  # the parent run's pre-registered gate plan (JSON), written when a sweep starts
UNATTRIBUTED = "the lift cannot be attributed to per-horizon queries"  # a reason the report leads with


@dataclass
class Study:
    main: GateResult
    attribution: Optional[GateResult] = None
    context_path: Optional[GateResult] = None
    verdict: Optional[str] = None
    diagnostics: dict = field(default_factory=dict)  # arm -> {metric: median over the arm's runs, or None}
    flags: list[str] = field(default_factory=list)
    noise: Optional[TrainingNoise] = None
    plan: Optional[dict] = None
    exploratory: list[str] = field(default_factory=list)  # how this gate differs from the plan


def study_result(
    inputs: SweepInputs,
    cfg: GateConfig,
    control: str,
    treatment: str,
    progress: bool = True,
    boot: Optional[Resamples] = None,
) -> Study:
    noise = None
    if len(inputs.replicates) == 1:
        noise = matching_noise(inputs.run(control, 0, inputs.replicates[0]).params, inputs.horizons)
    boot = boot or resample(inputs, cfg, progress)  # a sequential study draws once for all its looks
    study = Study(decide(inputs, cfg, control, treatment, boot, noise), noise=noise)
    beside = {
        name: decide(inputs, cfg, a, b, boot, noise)
        for name, (a, b) in ATTRIBUTION.comparisons(control, treatment, inputs.arms).items()
    }
    study.attribution, study.context_path = beside.get("attribution"), beside.get("context_path")
    if study.attribution is not None:
        study.verdict = attribution_verdict(study.attribution, study.main)
    study.diagnostics = {arm: _diagnostics(inputs, arm) for arm in inputs.arms}
    study.flags = _flags(study, control, treatment)
    if study.flags and study.main.decision == f"ship_{treatment}" and study.attribution is None:
        study.main.reasons.append(
            f"{UNATTRIBUTED}: "
            + "; ".join(study.flags)
            + ". Run the three-arm sweep to separate them: perception-sweep local --arms "
            f"{','.join(ATTRIBUTION.arms)} (same overrides)"
        )
    elif study.verdict:
        study.main.reasons.append(f"attribution ({ATTRIBUTION.context_control} -> {treatment}): {study.verdict}")
    study.plan, study.exploratory = _against_plan(inputs, cfg, control, treatment)
    return study


def attribution_verdict(attr: GateResult, main: GateResult) -> str:
    if attr.decision == f"ship_{attr.treatment}":
        return "per-horizon queries add lift beyond the context path"
    if attr.decision == f"keep_{attr.control}":
        if main.decision == f"ship_{main.treatment}":
            return (
                "the lift is explained by feeding pooled context to the heads: per-horizon queries add none beyond it"
            )
        return "per-horizon queries add no lift beyond the context path"
    return "the data cannot tell whether per-horizon queries add lift beyond the context path"


def _diagnostics(inputs: SweepInputs, arm: str) -> dict:
    runs = inputs.arm_runs(arm)
    out = {}
    for key in (
        "grad_norm_pool_query",
        *TRUNK_GROUPS,
        "grad_norm_heads",
        "query_divergence",
        "attention_entropy_ratio",
        "query_drift",
    ):
        values = [r.diagnostics[key] for r in runs if key in r.diagnostics and math.isfinite(r.diagnostics[key])]
        out[key] = float(np.median(values)) if values else None
    trunk = [t for k in TRUNK_GROUPS if (t := out[k]) is not None]
    out["grad_norm_trunk"] = float(np.sqrt(sum(t * t for t in trunk))) if len(trunk) == len(TRUNK_GROUPS) else None
    return out


def _flags(study: Study, control: str, treatment: str) -> list[str]:
    flags = []
    c = study.diagnostics.get(control, {})
    if c.get("grad_norm_pool_query") is not None and c.get("grad_norm_trunk"):
        if c["grad_norm_pool_query"] < NO_SIGNAL_RATIO * c["grad_norm_trunk"]:
            flags.append(
                f"the control's pool query received no learning signal (gradient norm "
                f"{c['grad_norm_pool_query']:.3g} against the trunk's {c['grad_norm_trunk']:.3g})"
            )
    t = study.diagnostics.get(treatment, {})
    if (
        treatment == ATTRIBUTION.treatment
        and t.get("query_divergence") is not None
        and t["query_divergence"] < MIN_DIVERGENCE
    ):
        flags.append(
            f"the treatment's queries did not specialise (query divergence {t['query_divergence']:.3g} "
            f"< {MIN_DIVERGENCE:g})"
        )
    if (
        treatment == ATTRIBUTION.treatment
        and t.get("attention_entropy_ratio") is not None
        and t["attention_entropy_ratio"] >= NEAR_UNIFORM
    ):
        flags.append(
            f"the treatment's queries stayed near uniform over the window (attention entropy "
            f"{t['attention_entropy_ratio']:.3g} of the uniform's, >= {NEAR_UNIFORM:g})"
        )
    return flags


def gate_plan(
    cfg: GateConfig, control: str, treatment: str, arms: list[str], replicates: int, design: str = FIXED
) -> dict:
    """What a sweep pre-registers on its parent run before any training: rule, weights, thresholds, and
    for a sequential study its looks and boundaries (`replicates` is then the most it may train)."""
    return {
        "control": control,
        "treatment": treatment,
        "arms": list(arms),
        "replicates": int(replicates),
        "settings": plan_settings(cfg),
        **plan_fields(design, replicates, cfg.alpha),
    }


def plan_settings(cfg: GateConfig) -> dict:
    return {
        "weights": {str(h): float(w) for h, w in sorted(cfg.weights.items())},
        "min_lift": cfg.min_lift,
        "noise_floor": cfg.noise_floor,
        "shift_horizons": list(cfg.shift_horizons),
        "shift_allows_loss": cfg.shift_allows_loss,
        "alpha": cfg.alpha,
        "multiplicity": MULTIPLICITY,
        "n_bootstrap": cfg.n_bootstrap,
        "seed": cfg.seed,
    }


def _against_plan(
    inputs: SweepInputs, cfg: GateConfig, control: str, treatment: str
) -> tuple[Optional[dict], list[str]]:
    text = inputs.parent_tags.get(PLAN_TAG)
    if not text:
        return None, []
    try:
        plan = json.loads(text)
    except ValueError:
        return None, [f"the parent run's {PLAN_TAG} tag is not JSON"]
    diffs = [
        f"{k}: planned {plan.get(k)!r}, gated {v!r}"
        for k, v in (("control", control), ("treatment", treatment))
        if plan.get(k) != v
    ]
    planned = plan.get("settings", {})
    diffs += [
        f"{k}: planned {planned.get(k)!r}, gated {v!r}" for k, v in plan_settings(cfg).items() if planned.get(k) != v
    ]
    return plan, diffs
