"""The sequential design (DESIGN §7): a study in waves of replicates, decided at every look, that stops
as soon as the evidence is in, with one α over every look and both rules.

The procedure: group-sequential boundaries inside the two rules' Holm graph (Maurer & Bretz 2013, graphical
approaches for group-sequential designs: weights ½, ½ and full transfer). Each rule holds a local level a (α/2,
or α once the other rule is rejected) and spends it over the looks with the Kim–DeMets power family,
a·(k/K)^ρ at look k. Its nominal level at look k is the one that spends exactly that increment when the looks'
statistics are the nested normal sums of k equal waves (corr(Z_j, Z_k) = √(j/k)), solved look by look with the
multivariate normal; at one look it is the fixed design's α/2 and α. The looks' evidence is not normal (look 1
between folds has 2 df, or an A/A file; later looks pool replicates with Satterthwaite's df), so the whole
study's rate is checked by simulation on planted-effect worlds (studies/gate_oc_sequential.py), where the
free choices, ρ and the futility bound, were set on calibration worlds apart from the reported ones.

Futility (non-binding): before the last look the study stops as keep_<control> when both rules' p exceed the
look's futility bound. The efficacy bounds are computed as if it never stopped there, so ignoring it
(continuing anyway) cannot raise the false-ship rate.

After an early stop the lift is biased upward (the study stopped because it was large); the report gives it with
the repeated confidence interval L ± t_{ν, 1−c_k/2}·se at the stopping look's nominal level c_k (Jennison &
Turnbull's repeated interval: it covers the true lift at every look at once with probability about 1 − α).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from perception.errors import ConfigError

FIXED, SEQUENTIAL = "fixed", "sequential"
DESIGNS = (FIXED, SEQUENTIAL)
DEFAULT_MAX_REPLICATES = 3
SPENDING_RHO = 4.0  # a·t^ρ: little α at look 1, whose 2-df evidence could rarely use it (set on calibration worlds)
FUTILITY_P = 0.35  # stop as keep before the last look when both rules' p exceed this (set on calibration worlds)
METHOD = "group-sequential"
SPENDING = "group-sequential power-family spending a*t^{rho} per rule inside holm(rule 1, rule 2) (Maurer-Bretz)"
LEGACY_SPENDING = "Bonferroni alpha-spending over looks inside holm(rule 1, rule 2)"

CONTINUE, SHIP, KEEP, INCONCLUSIVE = "continue", "ship", "keep", "inconclusive"


@dataclass(frozen=True)
class Boundaries:
    """The pre-registered boundaries of a sequential study of up to `max_looks` waves: at look k a rule holding
    α/2 rejects below half[k], one holding α (the other rule rejected) below full[k]."""

    alpha: float
    half: tuple[float, ...]
    full: tuple[float, ...]
    futility: tuple[Optional[float], ...]  # stop as keep at look k when both rules' p exceed it; None at the last
    rho: float = SPENDING_RHO
    method: str = METHOD

    @property
    def max_looks(self) -> int:
        return len(self.full)

    @property
    def efficacy(self) -> tuple[float, ...]:
        """The look's boundary for a rule that holds all of α."""
        return self.full

    def to_json(self) -> dict:
        spending = SPENDING.replace("{rho}", f"{self.rho:g}") if self.method == METHOD else LEGACY_SPENDING
        return {
            "alpha": self.alpha,
            "method": self.method,
            "rho": self.rho,
            "spending": spending,
            "efficacy_alpha": list(self.full),
            "efficacy_alpha_half": list(self.half),
            "futility_p": list(self.futility),
        }

    @classmethod
    def from_json(cls, doc: dict, where: str) -> "Boundaries":
        """Checks what a plan tag says before anything is decided with it. A plan without `method` is the
        earlier Bonferroni spending: look k's share α_k, a rule's level α_k/2 or α_k."""
        try:
            full = tuple(float(x) for x in doc["efficacy_alpha"])
            fut = tuple(None if x is None else float(x) for x in doc["futility_p"])
            alpha, rho = float(doc["alpha"]), float(doc.get("rho", SPENDING_RHO))
            method = str(doc.get("method", "bonferroni"))
            half = (
                tuple(float(x) for x in doc["efficacy_alpha_half"]) if method == METHOD else tuple(a / 2 for a in full)
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"{where}: boundaries {doc!r} are malformed ({e!r}); expected alpha, method, rho, "
                f"efficacy_alpha and efficacy_alpha_half (one per look) and futility_p (one per look, "
                f"null at the last)"
            )
        if not full or len(fut) != len(full) or len(half) != len(full) or fut[-1] is not None:
            raise ConfigError(
                f"{where}: boundaries need one efficacy_alpha, efficacy_alpha_half and futility_p per "
                f"look, futility_p null at the last; got {list(full)}, {list(half)} and {list(fut)}"
            )
        if any(f is not None and not (0 < f < 1) for f in fut):
            raise ConfigError(f"{where}: futility_p {list(fut)} must lie in (0, 1)")
        if method == METHOD:
            expected = boundaries(len(full), alpha, rho, fut[0] if len(fut) > 1 and fut[0] is not None else FUTILITY_P)
            if not _close(full, expected.full) or not _close(half, expected.half):
                raise ConfigError(
                    f"{where}: efficacy_alpha {list(full)} / efficacy_alpha_half {list(half)} are not "
                    f"the {METHOD} boundaries of alpha {alpha:g}, rho {rho:g} over {len(full)} looks "
                    f"({[round(x, 5) for x in expected.full]} / {[round(x, 5) for x in expected.half]})"
                )
        elif method != "bonferroni":
            raise ConfigError(f"{where}: boundaries method {method!r}; expected {METHOD!r}")
        elif any(not (0 <= a < 1) for a in full) or sum(full) > alpha * (1 + 1e-9):
            raise ConfigError(
                f"{where}: efficacy_alpha {list(full)} must be in [0, 1) and sum to at most alpha {alpha:g}"
            )
        return cls(alpha, half, full, fut, rho, method)


def _close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-7) for x, y in zip(a, b))


@lru_cache(maxsize=32)
def nominal_levels(max_looks: int, level: float, rho: float) -> tuple[float, ...]:
    """One rule's nominal one-sided p-levels c_1 … c_K: P(Z_1 < z_1, …, Z_{k−1} < z_{k−1}, Z_k ≥ z_k) equals the
    spending increment level·((k/K)^ρ − ((k−1)/K)^ρ), Z_k = S_k/√k for S_k a sum of k standard normal waves.

    Armitage–McPherson–Rowe recursion on a grid of S (the density of S_k on the continuation region is the
    last one's convolved with the next wave's): deterministic, and milliseconds where scipy's randomized
    multivariate normal takes minutes at six looks for the same precision."""
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    t = np.arange(1, max_looks + 1) / max_looks
    increments = np.diff(np.concatenate([[0.0], level * t**rho]))
    step = 0.005
    grid = np.arange(-10.0 * math.sqrt(max_looks), 10.0 * math.sqrt(max_looks), step)  # (G,) values of S
    wave = norm.pdf(np.arange(-8.0 / step, 8.0 / step + 1) * step) * step  # (2M+1,) one wave's step, × width
    alive = norm.pdf(grid) * step  # (G,) mass of S_k on the grid while the study runs (k = 1 before look 1)
    out = []
    for k, inc in enumerate(increments, start=1):

        def crossing(b: float) -> float:  # P(still running at look k − 1, S_k ≥ b)
            return float(norm.sf(b)) if k == 1 else float(np.sum(alive * norm.sf(b - grid)))

        bound = (
            math.inf
            if inc <= 0
            else float(brentq(lambda b: crossing(b) - inc, -5.0 * math.sqrt(k), 12.0 * math.sqrt(k), xtol=1e-12))
        )
        out.append(float(norm.sf(bound / math.sqrt(k))))
        if k > 1:
            alive = np.convolve(alive, wave, mode="same")  # (G,) S_k = S_{k−1} + one more wave
        alive = np.where(grid < bound, alive, 0.0)  # the studies that did not stop at look k
    return tuple(out)


def boundaries(max_looks: int, alpha: float, rho: float = SPENDING_RHO, futility_p: float = FUTILITY_P) -> Boundaries:
    """Each rule's nominal levels at α/2 and at α, and the same futility bound at every look but the last."""
    if max_looks < 1:
        raise ConfigError(f"--max-replicates {max_looks}: expected 1 or more")
    return Boundaries(
        alpha,
        nominal_levels(max_looks, alpha / 2, rho),
        nominal_levels(max_looks, alpha, rho),
        tuple([futility_p] * (max_looks - 1) + [None]),
        rho,
    )


def plan_fields(design: str, max_replicates: int, alpha: float) -> dict:
    """What a sequential study adds to the parent run's gate_plan tag."""
    if design == FIXED:
        return {"design": FIXED}
    return {
        "design": SEQUENTIAL,
        "max_replicates": int(max_replicates),
        "boundaries": boundaries(max_replicates, alpha).to_json(),
    }


def planned_boundaries(plan: Optional[dict], where: str) -> Optional[Boundaries]:
    """The boundaries a plan pre-registered, or None for a fixed design (or no plan)."""
    if not plan or plan.get("design", FIXED) == FIXED:
        return None
    if plan.get("design") != SEQUENTIAL:
        raise ConfigError(f"{where}: design {plan.get('design')!r}; expected one of {list(DESIGNS)}")
    bounds = Boundaries.from_json(plan.get("boundaries") or {}, where)
    if plan.get("max_replicates") != bounds.max_looks:
        raise ConfigError(
            f"{where}: max_replicates {plan.get('max_replicates')!r} but {bounds.max_looks} looks of boundaries"
        )
    return bounds


@dataclass
class LookVerdict:
    look: int
    verdict: str  # continue | ship | keep | inconclusive
    rule: Optional[str]  # the rule that decides (fired), if any
    reason: str
    level: float  # the look's boundary for a rule holding all of α
    rules: list  # the two RuleResults concluded at this look's Holm levels (copies)


def look_verdict(rule1, rule2, look: int, bounds: Boundaries, noise_floor: float) -> LookVerdict:
    """The sequential decision at `look` (1-based) from the two rules' evidence of that look
    (perception.gate.decision.RuleResult with lift, fired, p_bootstrap, se, df filled in)."""
    from perception.gate.decision import conclude
    from perception.gate.evidence import holm_levels

    K = bounds.max_looks
    if not 1 <= look <= K:
        raise ValueError(f"look {look} outside 1..{K}")
    half, a_k = bounds.half[look - 1], bounds.full[look - 1]
    rules = [copy.copy(rule1), copy.copy(rule2)]
    for r, level in zip(rules, holm_levels(rules[0].p_bootstrap, rules[1].p_bootstrap, a_k, half)):
        conclude(r, level, noise_floor)
    fired = next((r for r in rules if r.fired), None)
    if fired is not None and (fired.evidence_test or fired.evidence_floor):
        return LookVerdict(
            look,
            SHIP,
            fired.name,
            f"look {look}: {fired.name}'s p = {fired.p_bootstrap:.4g} "
            f"< {fired.level:.4g}, its boundary at this look: efficacy boundary crossed",
            a_k,
            rules,
        )
    futility = bounds.futility[look - 1]
    ps = [r.p_bootstrap for r in rules]
    if futility is not None and all(math.isfinite(p) and p > futility for p in ps):
        return LookVerdict(
            look,
            KEEP,
            fired.name if fired else None,
            f"look {look}: both rules' p ({ps[0]:.3g}, {ps[1]:.3g}) > {futility:g}: "
            f"futility boundary crossed, a clear absence",
            a_k,
            rules,
        )
    if look < K:
        return LookVerdict(
            look,
            CONTINUE,
            fired.name if fired else None,
            f"look {look}: no boundary crossed (efficacy p < {half:.4g}, futility p > "
            f"{futility:g}): the next wave trains",
            a_k,
            rules,
        )
    if fired is None:
        return LookVerdict(look, KEEP, None, f"look {look} (the last): no rule fired", a_k, rules)
    return LookVerdict(
        look,
        INCONCLUSIVE,
        fired.name,
        f"look {look} (the last): {fired.name} fired without evidence at its level {fired.level:.4g}",
        a_k,
        rules,
    )


def settle(verdicts: list[LookVerdict]) -> Optional[LookVerdict]:
    """The first look whose verdict stops this comparison, or None while every look says continue."""
    return next((v for v in verdicts if v.verdict != CONTINUE), None)


def repeated_interval(lift: float, se: float, df: float, alpha_k: float) -> tuple[float, float]:
    """The repeated confidence interval at a look whose nominal level is α_k: L ± t_{ν, 1−α_k/2}·se."""
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
