"""One α over both rules (Holm) and each rule's minimum detectable effect (DESIGN §7).

The gate ships by rule 1 (W) or, when rule 1 does not fire, by rule 2 (G); either route needs its
rule's null (true W ≤ 0, true G ≤ 0) rejected. Holm's step-down over the two one-sided tests keeps the
chance of rejecting any true null at most α, so P(ship | no horizon differs) ≤ α over both routes
together: the smaller p is tested at α/2, and if it is rejected the other at α. The noise floor adds no
route of its own: its lower bound is taken at the rule's Holm level, and a bound at or above a floor
≥ 0 is a rejection at that level.
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.stats import chi2, nct, norm
from scipy.stats import t as student_t

MULTIPLICITY = "holm(rule 1, rule 2)"  # written into the plan and the report
POWER = 0.8  # the minimum detectable effect is shipped this often


def holm_levels(p1: float, p2: float, alpha: float, half: float | None = None) -> tuple[float, float]:
    """The level each rule's p is compared with under Holm over the two (a NaN p never rejects): `half`
    (default alpha / 2) for each, `alpha` for one once the other is rejected at `half`. A sequential look
    passes its group-sequential levels for a rule holding α/2 and α."""
    half = alpha / 2 if half is None else half
    ok1, ok2 = math.isfinite(p1), math.isfinite(p2)
    level1 = alpha if ok2 and p2 < half else half
    level2 = alpha if ok1 and p1 < half else half
    return level1, level2


def t_quantile(level: float, df: float) -> float:
    """The one-sided critical value at `level`: Student's t, the normal's where df is infinite."""
    return float(student_t.isf(level, df)) if math.isfinite(df) else float(norm.isf(level))


def minimum_detectable(se: float, df: float, level: float, threshold: float, power: float = POWER) -> float:
    """The smallest true lift m shipped with probability `power` by a rule that needs its observed
    lift ≥ `threshold` and its test rejected at `level`: the larger of the test's need (noncentral t
    with the rule's df, so an estimated se costs what it costs) and the threshold's (the observed lift
    is about normal around m with sd σ). σ is read from the estimate se as se / √(median χ²_df / df),
    so the reported m is as often above the true one as below: se itself reads low more often than
    high (its median is 0.83 σ at 2 df, 0.95 σ at 7), which would report an m shipped only ~7 times
    in 10 at 2 df. NaN where the rule has no se."""
    if not (math.isfinite(se) and se > 0):
        return math.nan
    crit = t_quantile(level, df)
    if math.isfinite(df):
        sigma = se / math.sqrt(float(chi2.median(df)) / df)
        ncp = brentq(lambda d: float(nct.sf(crit, df, d)) - power, 0.0, crit + 50.0)
    else:
        sigma, ncp = se, crit + float(norm.isf(1 - power))
    return max(ncp * sigma, threshold + float(norm.isf(1 - power)) * sigma)
