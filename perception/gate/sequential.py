"""The sequential design (DESIGN §7): a study in waves of replicates, decided at every look, that stops
as soon as the evidence is in, with one α over every look and both rules.

The procedure: Bonferroni α-spending over the looks inside the two rules' Holm graph (Maurer–Bretz's
graphical scheme with weights ½, ½ and full transfer). Look k spends α_k = α·(f(k/K) − f((k−1)/K)),
f(t) = t^ρ (the Kim–DeMets power family, ρ = 3), so Σ_k α_k = α. At look k the two rules' p-values are
taken through Holm at α_k (the smaller at α_k/2, the other at α_k once it is rejected); the rule that
decides ships when its test rejects at its level. Under no effect a ship needs some look's smaller p
below α_k/2, or (one rule's null false) the true rule's p below α_k: by the union bound either happens
with probability at most Σ_k α_k = α, whatever the dependence between looks and whatever form a look's
evidence takes (look 1 between folds or with an A/A file, later looks pooled replicates with
Satterthwaite's df), provided each look's p is valid on its own, which the fixed design's benchmark
measures. The simulation (benchmarks/gate_oc_sequential.py) checks the whole study's rate.

Futility (non-binding): before the last look the study stops as keep_<control> when both rules' p
exceed the look's futility bound. The efficacy bounds are computed as if it never stopped there, so
ignoring it (continuing anyway) cannot raise the false-ship rate.

After an early stop the lift is biased upward (the study stopped because it was large); the report
gives it with the repeated confidence interval L ± t_{ν, 1−α_k/2}·se at the stopping look's α_k,
which covers the true lift at every look at once with probability ≥ 1 − α (the same union bound).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Optional

from perception.errors import ConfigError

FIXED, SEQUENTIAL = "fixed", "sequential"
DESIGNS = (FIXED, SEQUENTIAL)
DEFAULT_MAX_REPLICATES = 3
SPENDING_RHO = 3.0  # f(t) = t^ρ: little α at look 1, whose 2-df evidence could rarely use it
FUTILITY_P = 0.25  # stop as keep before the last look when both rules' p exceed this (set on simulated worlds)
SPENDING = "Bonferroni alpha-spending over looks, power family t^{rho}, inside holm(rule 1, rule 2)"

CONTINUE, SHIP, KEEP, INCONCLUSIVE = "continue", "ship", "keep", "inconclusive"


@dataclass(frozen=True)
class Boundaries:
    """The pre-registered boundaries of a sequential study of up to `max_looks` waves."""
    alpha: float
    efficacy: tuple[float, ...]  # α_k spent at look k; Σ = alpha
    futility: tuple[Optional[float], ...]  # stop as keep at look k when both rules' p exceed it; None at the last
    rho: float = SPENDING_RHO

    @property
    def max_looks(self) -> int:
        return len(self.efficacy)

    def to_json(self) -> dict:
        return {"alpha": self.alpha, "efficacy_alpha": list(self.efficacy), "futility_p": list(self.futility),
                "spending": SPENDING.replace("{rho}", f"{self.rho:g}"), "rho": self.rho}

    @classmethod
    def from_json(cls, doc: dict, where: str) -> "Boundaries":
        """Checks what a plan tag says before anything is decided with it."""
        try:
            eff = tuple(float(x) for x in doc["efficacy_alpha"])
            fut = tuple(None if x is None else float(x) for x in doc["futility_p"])
            alpha, rho = float(doc["alpha"]), float(doc.get("rho", SPENDING_RHO))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: boundaries {doc!r} are malformed ({e!r}); expected alpha, "
                              f"efficacy_alpha (one per look) and futility_p (one per look, null at the last)")
        if not eff or len(fut) != len(eff) or fut[-1] is not None:
            raise ConfigError(f"{where}: boundaries need one efficacy_alpha and one futility_p per look, "
                              f"futility_p null at the last; got {list(eff)} and {list(fut)}")
        if any(not (0 <= a < 1) for a in eff) or sum(eff) > alpha * (1 + 1e-9):
            raise ConfigError(f"{where}: efficacy_alpha {list(eff)} must be in [0, 1) and sum to at most alpha {alpha:g}")
        if any(f is not None and not (0 < f < 1) for f in fut):
            raise ConfigError(f"{where}: futility_p {list(fut)} must lie in (0, 1)")
        return cls(alpha, eff, fut, rho)


def boundaries(max_looks: int, alpha: float, rho: float = SPENDING_RHO, futility_p: float = FUTILITY_P) -> Boundaries:
    """α_k = α·((k/K)^ρ − ((k−1)/K)^ρ) and the same futility bound at every look but the last."""
    if max_looks < 1:
        raise ConfigError(f"--max-replicates {max_looks}: expected 1 or more")
    spent = [alpha * (k / max_looks) ** rho for k in range(max_looks + 1)]
    efficacy = tuple(b - a for a, b in zip(spent, spent[1:]))
    return Boundaries(alpha, efficacy, tuple([futility_p] * (max_looks - 1) + [None]), rho)


def plan_fields(design: str, max_replicates: int, alpha: float) -> dict:
    """What a sequential study adds to the parent run's gate_plan tag."""
    if design == FIXED:
        return {"design": FIXED}
    return {"design": SEQUENTIAL, "max_replicates": int(max_replicates),
            "boundaries": boundaries(max_replicates, alpha).to_json()}


def planned_boundaries(plan: Optional[dict], where: str) -> Optional[Boundaries]:
    """The boundaries a plan pre-registered, or None for a fixed design (or no plan)."""
    if not plan or plan.get("design", FIXED) == FIXED:
        return None
    if plan.get("design") != SEQUENTIAL:
        raise ConfigError(f"{where}: design {plan.get('design')!r}; expected one of {list(DESIGNS)}")
    bounds = Boundaries.from_json(plan.get("boundaries") or {}, where)
    if plan.get("max_replicates") != bounds.max_looks:
        raise ConfigError(f"{where}: max_replicates {plan.get('max_replicates')!r} but "
                          f"{bounds.max_looks} looks of boundaries")
    return bounds


@dataclass
class LookVerdict:
    look: int
    verdict: str  # continue | ship | keep | inconclusive
    rule: Optional[str]  # the rule that decides (fired), if any
    reason: str
    level: float  # α_k
    rules: list  # the two RuleResults concluded at this look's Holm levels (copies)


def look_verdict(rule1, rule2, look: int, bounds: Boundaries, noise_floor: float) -> LookVerdict:
    """The sequential decision at `look` (1-based) from the two rules' evidence of that look
    (perception.gate.decision.RuleResult with lift, fired, p_bootstrap, se, df filled in)."""
    from perception.gate.decision import conclude
    from perception.gate.evidence import holm_levels

    K = bounds.max_looks
    if not 1 <= look <= K:
        raise ValueError(f"look {look} outside 1..{K}")
    a_k = bounds.efficacy[look - 1]
    rules = [copy.copy(rule1), copy.copy(rule2)]
    for r, level in zip(rules, holm_levels(rules[0].p_bootstrap, rules[1].p_bootstrap, a_k)):
        conclude(r, level, noise_floor)
    fired = next((r for r in rules if r.fired), None)
    if fired is not None and (fired.evidence_test or fired.evidence_floor):
        return LookVerdict(look, SHIP, fired.name, f"look {look}: {fired.name}'s p = {fired.p_bootstrap:.4g} "
                           f"< {fired.level:.4g}, its share of alpha at this look: efficacy boundary crossed",
                           a_k, rules)
    futility = bounds.futility[look - 1]
    ps = [r.p_bootstrap for r in rules]
    if futility is not None and all(math.isfinite(p) and p > futility for p in ps):
        return LookVerdict(look, KEEP, fired.name if fired else None,
                           f"look {look}: both rules' p ({ps[0]:.3g}, {ps[1]:.3g}) > {futility:g}: "
                           f"futility boundary crossed, a clear absence", a_k, rules)
    if look < K:
        return LookVerdict(look, CONTINUE, fired.name if fired else None,
                           f"look {look}: no boundary crossed (efficacy at alpha {a_k:.4g}, futility p > "
                           f"{futility:g}): the next wave trains", a_k, rules)
    if fired is None:
        return LookVerdict(look, KEEP, None, f"look {look} (the last): no rule fired", a_k, rules)
    return LookVerdict(look, INCONCLUSIVE, fired.name, f"look {look} (the last): {fired.name} fired without "
                       f"evidence at its level {fired.level:.4g}", a_k, rules)


def settle(verdicts: list[LookVerdict]) -> Optional[LookVerdict]:
    """The first look whose verdict stops this comparison, or None while every look says continue."""
    return next((v for v in verdicts if v.verdict != CONTINUE), None)


def repeated_interval(lift: float, se: float, df: float, alpha_k: float) -> tuple[float, float]:
    """The repeated confidence interval at a look that spent α_k: L ± t_{ν, 1−α_k/2}·se."""
    from perception.gate.evidence import t_quantile

    if not (math.isfinite(se) and alpha_k > 0):
        return (math.nan, math.nan)
    q = t_quantile(alpha_k / 2, df)
    return (lift - q * se, lift + q * se)


def read_plan(tags: dict[str, str], plan_tag: str) -> Optional[dict]:
    text = tags.get(plan_tag)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
