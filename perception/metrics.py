"""AUC from midranks, shared by the trainer's validation and the gate's evidence, so both compute
the same number from the same predictions.

Numpy alone: scikit-learn's or scipy.stats' import costs ~1 s of CPU, which every training process
would pay for one function.
"""

from __future__ import annotations

import numpy as np


def midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, ties sharing the mean of their ranks (scipy.stats.rankdata's default)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])  # first index of each run of equal values
    ends = np.r_[starts[1:], len(xs)]
    ranks = np.empty(len(xs), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann–Whitney AUC with midranks (ties count one half); NaN when a class is empty or a score is."""
    scores, labels = np.asarray(scores), np.asarray(labels).astype(bool)
    m, n = int(labels.sum()), int((~labels).sum())
    if m == 0 or n == 0 or not np.isfinite(scores).all():
        return float("nan")
    return float((midranks(scores)[labels].sum() - m * (m + 1) / 2) / (m * n))
