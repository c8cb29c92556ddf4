"""The sequential design's boundaries and its decision at a look (perception.gate.sequential)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perception.errors import ConfigError
from perception.gate.decision import RuleResult
from perception.gate.sequential import (
    CONTINUE,
    INCONCLUSIVE,
    KEEP,
    SHIP,
    Boundaries,
    boundaries,
    look_verdict,
    nominal_levels,
    plan_fields,
    planned_boundaries,
    repeated_interval,
)
from perception.sweep.design import replicates_flag


def rule(name: str, p: float, fired: bool = True, lift: float = 0.03, se: float = 0.01, df: float = 8.0) -> RuleResult:
    return RuleResult(name, "", "W" if name == "rule 1" else "G", lift, [1000], [1.0], fired, p, math.nan, se=se, df=df)


def test_nominal_levels_spend_the_power_family_and_grow_with_the_looks():
    b = boundaries(3, 0.05, rho=2.5)
    assert b.full[0] == pytest.approx(0.05 / 3**2.5)  # look 1 spends (1/3)^rho of alpha, alone
    assert b.half[0] == pytest.approx(0.025 / 3**2.5)
    assert b.full[0] < b.full[1] < b.full[2] < 0.05 and all(h < f for h, f in zip(b.half, b.full))
    # the last look's level is above what a union bound leaves (alpha − the earlier looks' spending):
    # the looks are nested sums, so a study that crossed late would mostly have crossed early too
    assert b.full[2] > 0.05 * (1 - (2 / 3) ** 2.5) + 0.005
    assert b.futility[-1] is None and all(f is not None for f in b.futility[:-1])
    one = boundaries(1, 0.05)  # one look: the fixed design's Holm levels
    assert one.full == pytest.approx((0.05,)) and one.half == pytest.approx((0.025,))


def test_nominal_levels_against_the_multivariate_normal():
    """Pocock's constant boundary (rho = 1 spends alpha/K a look): the three looks' crossing probabilities from
    scipy's multivariate normal equal the spending's increments."""
    from scipy.stats import multivariate_normal, norm

    levels = nominal_levels(3, 0.05, 1.0)
    z = [norm.isf(c) for c in levels]
    t = np.arange(1, 4) / 3
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    survive1 = norm.cdf(z[0])
    survive2 = multivariate_normal.cdf(z[:2], cov=cov[:2, :2], rng=np.random.default_rng(1))
    survive3 = multivariate_normal.cdf(z, cov=cov, rng=np.random.default_rng(1))
    assert 1 - survive1 == pytest.approx(0.05 / 3, rel=1e-3)
    assert survive1 - survive2 == pytest.approx(0.05 / 3, rel=2e-3)
    assert survive2 - survive3 == pytest.approx(0.05 / 3, rel=2e-3)


def test_plan_round_trip_and_malformed_plans_are_named():
    plan = plan_fields("sequential", 3, 0.05)
    assert plan["design"] == "sequential" and plan["max_replicates"] == 3
    assert planned_boundaries(plan, "tag") == boundaries(3, 0.05)
    assert planned_boundaries(plan_fields("fixed", 3, 0.05), "tag") is None
    assert planned_boundaries(None, "tag") is None
    with pytest.raises(ConfigError, match="tag: max_replicates 2 but 3 looks"):
        planned_boundaries({**plan, "max_replicates": 2}, "tag")
    with pytest.raises(ConfigError, match="are not the group-sequential boundaries of alpha 0.05"):
        planned_boundaries({**plan, "boundaries": {**plan["boundaries"], "efficacy_alpha": [0.02, 0.02, 0.02]}}, "tag")
    legacy = {"alpha": 0.05, "efficacy_alpha": [0.002, 0.013, 0.035], "futility_p": [0.25, 0.25, None]}
    old = planned_boundaries({**plan, "boundaries": legacy}, "tag")  # a plan pre-registered before the method key
    assert old.full == (0.002, 0.013, 0.035) and old.half == (0.001, 0.0065, 0.0175)
    with pytest.raises(ConfigError, match="sum to at most alpha"):
        planned_boundaries({**plan, "boundaries": {**legacy, "efficacy_alpha": [0.02, 0.02, 0.02]}}, "tag")
    with pytest.raises(ConfigError, match="futility_p null at the last"):
        planned_boundaries({**plan, "boundaries": {**plan["boundaries"], "futility_p": [0.3, 0.3, 0.3]}}, "tag")
    with pytest.raises(ConfigError, match="tag: design 'adaptive'"):
        planned_boundaries({"design": "adaptive"}, "tag")
    with pytest.raises(ConfigError, match="malformed"):
        Boundaries.from_json({"alpha": 0.05}, "tag")


def test_a_look_ships_only_below_its_boundary():
    b = boundaries(3, 0.05)
    # look 1: p = 0.01 would ship a fixed design (< 0.025) but not look 1 (its half-alpha boundary < 0.002)
    v = look_verdict(rule("rule 1", 0.01), rule("rule 2", 0.2, fired=False), 1, b, noise_floor=0.024)
    assert v.verdict == CONTINUE and v.rules[0].level == pytest.approx(b.half[0])
    v = look_verdict(rule("rule 1", b.half[1] * 0.9), rule("rule 2", 0.5, fired=False), 2, b, noise_floor=0.024)
    assert v.verdict == SHIP and v.rule == "rule 1"
    # Holm inside the look: rule 2 rejected at its half boundary lifts rule 1's to the full one
    v = look_verdict(rule("rule 1", b.full[1] * 0.9), rule("rule 2", b.half[1] * 0.5), 2, b, noise_floor=0.024)
    assert v.verdict == SHIP and v.rules[0].level == pytest.approx(b.full[1])
    v = look_verdict(rule("rule 1", b.full[1] * 0.9), rule("rule 2", b.half[1] * 1.5), 2, b, noise_floor=0.024)
    assert v.verdict == CONTINUE and v.rules[0].level == pytest.approx(b.half[1])


def test_futility_stops_a_clear_absence_before_the_last_look_only():
    b = boundaries(3, 0.05)
    v = look_verdict(rule("rule 1", 0.6, fired=False), rule("rule 2", 0.45, fired=False), 1, b, noise_floor=0.024)
    assert v.verdict == KEEP and "futility" in v.reason
    v = look_verdict(rule("rule 1", 0.6), rule("rule 2", 0.2), 1, b, noise_floor=0.024)  # rule 2 not clearly absent
    assert v.verdict == CONTINUE
    v = look_verdict(rule("rule 1", math.nan), rule("rule 2", 0.9), 2, b, noise_floor=0.024)  # no p: no futility
    assert v.verdict == CONTINUE
    assert (
        look_verdict(
            rule("rule 1", 0.6, fired=False), rule("rule 2", 0.45, fired=False), 3, b, noise_floor=0.024
        ).verdict
        == KEEP
    )
    assert (
        look_verdict(rule("rule 1", 0.04), rule("rule 2", 0.45, fired=False), 3, b, noise_floor=0.024).verdict
        == INCONCLUSIVE
    )  # p < 0.05 but not < look 3's half boundary


def test_the_study_spends_alpha_over_nested_looks():
    """Nested looks (look k pools the first k waves: correlated z's) under no effect: a study where only rule 1
    can ship spends its half of alpha over the three looks (the boundaries are exact for normal looks), and
    one where both can ship stays under alpha."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    b = boundaries(3, 0.05)
    n = 10_000
    waves = rng.normal(size=(n, 2, 3))  # (study, rule, wave)
    z = np.cumsum(waves, axis=2) / np.sqrt(np.arange(1, 4))  # (n, 2, 3) the pooled z at each look
    p = norm.sf(z)

    def share_shipped(rule2_can_fire: bool) -> float:
        ships = 0
        for i in range(n):
            for k in range(3):
                second = rule2_can_fire and p[i, 1, k] < p[i, 0, k]  # the rule whose lift is the larger fires
                v = look_verdict(
                    rule("rule 1", p[i, 0, k], fired=not second),
                    rule("rule 2", p[i, 1, k], fired=second),
                    k + 1,
                    b,
                    1.0,
                )
                if v.verdict != CONTINUE:
                    ships += v.verdict == SHIP
                    break
        return ships / n

    one = share_shipped(False)  # rule 1 alone: its alpha/2, the futility stops only lowering it
    assert 0.018 < one <= 0.025 + 2 * math.sqrt(0.025 * 0.975 / n), one
    both = share_shipped(True)
    assert one < both <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / n), both


def test_repeated_interval_widens_at_a_smaller_level():
    lo1, hi1 = repeated_interval(0.03, 0.01, 10.0, 0.002)
    lo3, hi3 = repeated_interval(0.03, 0.01, 10.0, 0.035)
    assert lo1 < lo3 < 0.03 < hi3 < hi1


def test_each_design_takes_its_own_replicates_flag():
    assert replicates_flag("fixed", None, None) == 1 and replicates_flag("sequential", None, None) == 3
    assert replicates_flag("sequential", None, 2) == 2 and replicates_flag("fixed", 3, None) == 3
    with pytest.raises(ConfigError, match="cannot be combined"):
        replicates_flag("sequential", 2, 3)
    with pytest.raises(ConfigError, match="--design sequential takes --max-replicates"):
        replicates_flag("sequential", 2, None)
    with pytest.raises(ConfigError, match="needs --design sequential"):
        replicates_flag("fixed", None, 2)
