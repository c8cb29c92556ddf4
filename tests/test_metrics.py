"""The shared AUC: midranks as scipy's rankdata gives them, AUC as scikit-learn's roc_auc_score."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from perception.metrics import auc, midranks


@given(st.lists(st.integers(-5, 5), min_size=1, max_size=60))
def test_midranks_are_scipys_average_ranks_with_ties(values):
    x = np.array(values, dtype=np.float64)
    assert np.array_equal(midranks(x), rankdata(x))


@given(st.integers(0, 2**32 - 1), st.integers(2, 400), st.sampled_from([3, 20, 10_000]))
def test_auc_is_roc_auc_score_with_ties_counted_half(seed, n, levels):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    labels[:2] = [0, 1]  # both classes present
    scores = rng.integers(0, levels, n) / levels + 0.3 * labels  # ties at every level count
    assert auc(scores.astype(np.float32), labels) == pytest.approx(
        roc_auc_score(labels, scores.astype(np.float32)), abs=1e-12
    )


def test_auc_is_nan_for_one_class_or_a_nan_score():
    assert math.isnan(auc(np.array([0.1, 0.2]), np.array([1, 1])))
    assert math.isnan(auc(np.array([0.1, 0.2]), np.array([0, 0])))
    assert math.isnan(auc(np.array([0.1, np.nan, 0.3]), np.array([0, 1, 1])))
    assert auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0 and auc(np.array([0.9, 0.1]), np.array([0, 1])) == 0.0
