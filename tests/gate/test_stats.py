"""The gate's statistics against direct computations: DeLong vs the O(m·n) definition, AUC vs
scikit-learn, the bootstrap's resampled AUC vs an explicit resample, Stouffer, thinning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from sklearn.metrics import roc_auc_score

from perception.gate import stats


def _psi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Heaviside kernel on every (positive, negative) pair: 1 if x > y, 1/2 on a tie."""
    return (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])  # (m, n)


def delong_direct(score_a, score_b, labels):
    """DeLong et al. (1988) from its definition, O(m·n): structural components by pairs."""
    labels = labels.astype(bool)
    comps = []
    for s in (score_a, score_b):
        psi = _psi(s[labels], s[~labels])
        comps.append((psi.mean(), psi.mean(axis=1), psi.mean(axis=0)))
    (auc_a, v10a, v01a), (auc_b, v10b, v01b) = comps
    m, n = labels.sum(), (~labels).sum()
    s10 = np.cov(np.stack([v10a, v10b]))
    s01 = np.cov(np.stack([v01a, v01b]))
    cov = s10 / m + s01 / n
    var = cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]
    return auc_a, auc_b, var


@pytest.mark.parametrize("seed", range(6))
def test_delong_matches_the_direct_computation_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 300))
    labels = rng.random(n) < rng.uniform(0.2, 0.8)
    labels[:2], labels[2:4] = True, False
    # coarse scores: many ties within and across classes
    a = np.round(rng.normal(size=n) + 0.5 * labels, 1)
    b = np.round(0.7 * a + rng.normal(size=n) * 0.5 + 0.3 * labels, 1)
    got = stats.delong_paired(a, b, labels)
    auc_a, auc_b, var = delong_direct(a, b, labels)
    assert got.auc_a == pytest.approx(auc_a, abs=1e-12)
    assert got.auc_b == pytest.approx(auc_b, abs=1e-12)
    assert got.se**2 == pytest.approx(var, rel=1e-9, abs=1e-15)
    assert got.z == pytest.approx((auc_b - auc_a) / math.sqrt(var), rel=1e-9)


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=60))
def test_auc_matches_scikit_learn(pairs):
    scores = np.array([p[0] for p in pairs], dtype=float)
    labels = np.array([p[1] for p in pairs])
    if labels.all() or not labels.any():
        assert math.isnan(stats.auc(scores, labels))
    else:
        assert stats.auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_resampled_auc_equals_the_auc_of_the_explicit_resample(ties):
    rng = np.random.default_rng(3)
    n = 500
    labels = rng.random(n) < 0.4
    scores = rng.normal(size=n) + labels
    if ties:
        scores = np.round(scores, 1)
    valid = rng.random(n) < 0.9
    rows = np.flatnonzero(valid)
    presorted = stats.PresortedAUC(scores[rows], labels[rows], rows)
    counts = next(stats.block_counts(n, 37, 20, rng))  # (20, n)
    got = presorted.resampled(counts)
    for r in range(20):
        idx = np.repeat(np.arange(n), counts[r])
        idx = idx[valid[idx]]
        assert got[r] == pytest.approx(roc_auc_score(labels[idx], scores[idx]), abs=1e-12)


def test_block_counts_are_contiguous_blocks_covering_n_windows():
    rng = np.random.default_rng(0)
    n, block = 103, 10
    for counts in stats.block_counts(n, block, 300, rng):
        assert counts.shape[1] == n and (counts >= 0).all()
        assert (counts.sum(axis=1) == n).all()
    # every window is reachable, the edges less often: moving blocks, not circular ones
    total = sum(c.sum(axis=0) for c in stats.block_counts(n, block, 2000, np.random.default_rng(1)))
    assert (total > 0).all() and total[0] < total[n // 2]


def test_block_length_follows_window_horizon_and_stride():
    assert stats.block_length(6000, 6000, 50) == 240
    assert stats.block_length(32, 40, 4) == 18
    assert stats.block_length(33, 40, 4) == 19  # rounded up


def test_stouffer_and_one_sided_p():
    assert stats.stouffer(np.array([1.0, 1.0, 1.0, 1.0])) == pytest.approx(2.0)
    assert stats.stouffer(np.array([2.0, 0.0]), np.array([3.0, 1.0])) == pytest.approx(6 / math.sqrt(10))
    assert stats.stouffer(np.array([np.nan, 1.0])) == pytest.approx(1.0)  # a missing z is left out
    assert math.isnan(stats.stouffer(np.array([np.nan])))
    assert stats.one_sided_p(1.6448536) == pytest.approx(0.05, abs=1e-6)


def test_thinning_keeps_windows_at_least_the_spacing_apart():
    index = np.array([40, 0, 8, 4, 12, 16, 100, 104], dtype=np.int64)
    kept = stats.thin_by_index(index, 10)
    assert index[kept].tolist() == [0, 12, 40, 100]


def test_bootstrap_sees_dependence_that_an_iid_test_misses():
    """Δ driven by a few long episodes: i.i.d. DeLong is confident, the block bootstrap is not."""
    rng = np.random.default_rng(5)
    n, episode = 2000, 200
    y = rng.random((n, 1)) < 0.5
    noise = rng.normal(size=(n, 1))
    signs = np.repeat([1, 1, -1, 1, -1, 1, 1, -1, 1, -1], episode)[:, None]
    a = y * 0.6 + noise
    b = a + 0.2 * signs * (2.0 * y - 1)
    iid = stats.delong_paired(a[:, 0], b[:, 0], y[:, 0])
    boot = stats.paired_block_bootstrap(a, b, y, np.ones_like(y), episode, 2000, np.random.default_rng(0))[0]
    assert boot.delta == pytest.approx(iid.delta)
    assert stats.one_sided_p(iid.z) < 0.01
    assert stats.one_sided_p(boot.z) > 0.05
    assert boot.se > 3 * iid.se


def test_training_and_gate_auc_agree_on_ties():
    """Training logs val_auc_h{h} with scikit-learn; the gate ranks with midranks. Heavily tied
    scores (probabilities rounded to a few levels) must give the same AUC in both."""
    from perception.train.evaluate import per_horizon_auc

    rng = np.random.default_rng(3)
    labels = (rng.random((4000, 3)) < 0.4).astype(np.uint8)
    probs = np.round(rng.random((4000, 3)) * 0.3 + 0.4 * labels, 1).astype(np.float32)  # ~8 levels
    mask = rng.random((4000, 3)) < 0.9
    logged = per_horizon_auc(probs, labels, mask, [10, 30, 100])
    for j, h in enumerate([10, 30, 100]):
        m = mask[:, j]
        assert len(np.unique(probs[m, j])) < 10
        assert logged[h] == pytest.approx(stats.auc(probs[m, j], labels[m, j]), abs=1e-12)


def test_satterthwaite_degrees_of_freedom_and_the_t_test():
    from perception.gate.decision import one_sided_p_t, satterthwaite_df

    # all of the variance estimated from 4 cells: 4 df; none of it: infinite (a normal test)
    assert satterthwaite_df(0.02, 0.02, 4) == pytest.approx(4)
    assert satterthwaite_df(0.02, 0.0, 4) == math.inf and satterthwaite_df(0.02, 0.01, math.inf) == math.inf
    # half the variance estimated: se⁴ / (se_t⁴ / df) = 4 · df
    assert satterthwaite_df(math.sqrt(2) * 0.01, 0.01, 3) == pytest.approx(12)
    # a t with few df is more cautious than the normal, and becomes it as df grows
    assert one_sided_p_t(2.0, 3) > 0.05 > one_sided_p_t(2.0, math.inf)
    assert one_sided_p_t(2.0, 1e6) == pytest.approx(one_sided_p_t(2.0, math.inf), rel=1e-4)
    assert math.isnan(one_sided_p_t(math.nan, 3)) and one_sided_p_t(math.inf, 3) == 0.0


def test_holm_levels_give_one_alpha_over_both_rules():
    from perception.gate.evidence import holm_levels

    assert holm_levels(0.2, 0.3, 0.05) == (0.025, 0.025)  # neither rejected at alpha / 2
    assert holm_levels(0.01, 0.04, 0.05) == (0.025, 0.05)  # rule 1 rejected first: rule 2 at alpha
    assert holm_levels(0.04, 0.001, 0.05) == (0.05, 0.025)
    assert holm_levels(math.nan, 0.001, 0.05) == (0.05, 0.025) and holm_levels(0.001, math.nan, 0.05) == (0.025, 0.05)


def test_holm_false_rejection_rate_of_two_independent_nulls_is_at_most_alpha():
    from perception.gate.evidence import holm_levels

    p = np.random.default_rng(0).random((20_000, 2))
    any_false = [(p1 < l1) or (p2 < l2) for p1, p2 in p for l1, l2 in [holm_levels(p1, p2, 0.05)]]
    assert np.mean(any_false) == pytest.approx(1 - 0.975**2, abs=0.004)  # under alpha, near Bonferroni's


def test_minimum_detectable_effect_is_shipped_eight_times_in_ten():
    from perception.gate.evidence import minimum_detectable
    from scipy.stats import norm

    se = 0.01
    m = minimum_detectable(se, math.inf, 0.025, 0.0)  # normal: (z_0.975 + z_0.8) se
    assert m == pytest.approx((norm.isf(0.025) + norm.isf(0.2)) * se)
    assert minimum_detectable(se, math.inf, 0.025, 0.05) == pytest.approx(0.05 + norm.isf(0.2) * se)  # threshold binds
    assert math.isnan(minimum_detectable(math.nan, 6, 0.025, 0.0))


@pytest.mark.parametrize("df, threshold", [(2, 0.0), (3, 0.01), (7, 0.01), (30, 0.0), (math.inf, 0.01)])
def test_the_reported_minimum_detectable_effect_is_shipped_eight_times_in_ten(df, threshold):
    """The rule simulated: a lift about normal around m with sd σ, its se an estimate (σ² χ²_df / df), shipped
    when lift ≥ threshold and lift / se clears t_{df, 0.975}. Sweeps report an MDE from their own se; at m =
    the median of what they report, the rule ships 8 times in 10."""
    from scipy.stats import chi2

    from perception.gate.evidence import minimum_detectable, t_quantile

    rng, n, sigma = np.random.default_rng(int(df) if math.isfinite(df) else 99), 400_000, 0.01

    def se_hat(size):
        return sigma * (np.sqrt(rng.chisquare(df, size) / df) if math.isfinite(df) else np.ones(size))

    reported = np.array([minimum_detectable(s, df, 0.025, threshold) for s in se_hat(401)])
    # the MDE grows with se, so the sweeps' median MDE is the MDE of the median se, computed exactly
    median_se = sigma * math.sqrt(chi2.median(df) / df) if math.isfinite(df) else sigma
    m = minimum_detectable(median_se, df, 0.025, threshold)
    assert np.median(reported) == pytest.approx(m, rel=0.08)
    lift, s = m + sigma * rng.normal(size=n), se_hat(n)
    shipped = (lift >= threshold) & (lift / s > t_quantile(0.025, df))
    assert shipped.mean() == pytest.approx(0.8, abs=0.004)
