"""The sequential design's boundaries and its decision at a look (perception.gate.sequential)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perception.errors import ConfigError
from perception.gate.decision import RuleResult
from perception.gate.sequential import (CONTINUE, INCONCLUSIVE, KEEP, SHIP, Boundaries, boundaries, look_verdict,
                                        plan_fields, planned_boundaries, repeated_interval)
from perception.sweep.design import replicates_flag


def rule(name: str, p: float, fired: bool = True, lift: float = 0.03, se: float = 0.01, df: float = 8.0) -> RuleResult:
    return RuleResult(name, "", "W" if name == "rule 1" else "G", lift, [1000], [1.0], fired, p, math.nan,
                      se=se, df=df)


def test_spending_sums_to_alpha_and_grows_with_the_looks():
    b = boundaries(3, 0.05)
    assert sum(b.efficacy) == pytest.approx(0.05)
    assert b.efficacy[0] < b.efficacy[1] < b.efficacy[2]
    assert b.efficacy[0] == pytest.approx(0.05 / 27)  # (1/3)^3 of alpha
    assert b.futility[-1] is None and all(f is not None for f in b.futility[:-1])
    assert boundaries(1, 0.05).efficacy == pytest.approx((0.05,))  # one look: the fixed design's alpha


def test_plan_round_trip_and_malformed_plans_are_named():
    plan = plan_fields("sequential", 3, 0.05)
    assert plan["design"] == "sequential" and plan["max_replicates"] == 3
    assert planned_boundaries(plan, "tag") == boundaries(3, 0.05)
    assert planned_boundaries(plan_fields("fixed", 3, 0.05), "tag") is None
    assert planned_boundaries(None, "tag") is None
    with pytest.raises(ConfigError, match="tag: max_replicates 2 but 3 looks"):
        planned_boundaries({**plan, "max_replicates": 2}, "tag")
    with pytest.raises(ConfigError, match="sum to at most alpha"):
        planned_boundaries({**plan, "boundaries": {**plan["boundaries"], "efficacy_alpha": [0.02, 0.02, 0.02]}}, "tag")
    with pytest.raises(ConfigError, match="futility_p null at the last"):
        planned_boundaries({**plan, "boundaries": {**plan["boundaries"], "futility_p": [0.3, 0.3, 0.3]}}, "tag")
    with pytest.raises(ConfigError, match="tag: design 'adaptive'"):
        planned_boundaries({"design": "adaptive"}, "tag")
    with pytest.raises(ConfigError, match="malformed"):
        Boundaries.from_json({"alpha": 0.05}, "tag")


def test_a_look_ships_only_below_its_share_of_alpha():
    b = boundaries(3, 0.05)
    a1, a2 = b.efficacy[0], b.efficacy[1]
    # look 1: p = 0.01 would ship a fixed design (< 0.025) but not look 1 (alpha_1 / 2 < 0.001)
    v = look_verdict(rule("rule 1", 0.01), rule("rule 2", 0.2, fired=False), 1, b, noise_floor=0.024)
    assert v.verdict == CONTINUE and v.rules[0].level == pytest.approx(a1 / 2)
    v = look_verdict(rule("rule 1", a2 / 2 * 0.9), rule("rule 2", 0.5, fired=False), 2, b, noise_floor=0.024)
    assert v.verdict == SHIP and v.rule == "rule 1"
    # Holm inside the look: rule 2 rejected at alpha_k / 2 lifts rule 1's level to alpha_k
    v = look_verdict(rule("rule 1", a2 * 0.8), rule("rule 2", a2 / 2 * 0.5), 2, b, noise_floor=0.024)
    assert v.verdict == SHIP and v.rules[0].level == pytest.approx(a2)


def test_futility_stops_a_clear_absence_before_the_last_look_only():
    b = boundaries(3, 0.05)
    v = look_verdict(rule("rule 1", 0.6, fired=False), rule("rule 2", 0.45, fired=False), 1, b, noise_floor=0.024)
    assert v.verdict == KEEP and "futility" in v.reason
    v = look_verdict(rule("rule 1", 0.6), rule("rule 2", 0.2), 1, b, noise_floor=0.024)  # rule 2 not clearly absent
    assert v.verdict == CONTINUE
    v = look_verdict(rule("rule 1", math.nan), rule("rule 2", 0.9), 2, b, noise_floor=0.024)  # no p: no futility
    assert v.verdict == CONTINUE
    assert look_verdict(rule("rule 1", 0.6, fired=False), rule("rule 2", 0.45, fired=False), 3, b,
                        noise_floor=0.024).verdict == KEEP
    assert look_verdict(rule("rule 1", 0.04), rule("rule 2", 0.45, fired=False), 3, b,
                        noise_floor=0.024).verdict == INCONCLUSIVE  # p < 0.05 but not < alpha_3 / 2


def test_the_union_bound_holds_for_dependent_looks():
    """Nested looks (look k pools the first k waves: correlated z's) under no effect, both rules null: the
    share of studies that ship stays under alpha, as the union bound promises for any dependence."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    b = boundaries(3, 0.05)
    n = 10_000
    waves = rng.normal(size=(n, 2, 3))  # (study, rule, wave)
    z = np.cumsum(waves, axis=2) / np.sqrt(np.arange(1, 4))  # (n, 2, 3) the pooled z at each look
    p = norm.sf(z)
    ships = 0
    for i in range(n):
        for k in range(3):
            v = look_verdict(rule("rule 1", p[i, 0, k]), rule("rule 2", p[i, 1, k], fired=False), k + 1, b, 1.0)
            if v.verdict != CONTINUE:
                ships += v.verdict == SHIP
                break
    rate = ships / n
    assert 0.01 < rate <= 0.05, rate  # spending below alpha, not far below it


def test_repeated_interval_widens_at_a_smaller_share_of_alpha():
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
