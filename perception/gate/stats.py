"""Evidence for the gate (DESIGN §7): AUC from midranks, the paired moving-block bootstrap of
AUC_B − AUC_A, DeLong's paired test (Sun & Xu's fast algorithm) and Stouffer's combination.

Validation windows overlap (a window reads K snapshots, its label h more), so neighbouring windows
are nearly the same sample. The block bootstrap resamples runs of windows at least
`(K + h_max) / stride` long, which keeps that dependence inside each block; DeLong is only valid on
windows thinned to one per `K + h` snapshots, where no two share a snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from scipy.stats import norm, rankdata

from perception.metrics import auc  # the trainer's AUC: the gate recomputes exactly what was logged

BOOTSTRAP_CHUNK = 256  # resamples per batch: (256, N) int32 counts stay a few tens of MB at N = 30k


# ---------------------------------------------------------------- DeLong (Sun & Xu 2014)


@dataclass(frozen=True)
class PairedTest:
    auc_a: float
    auc_b: float
    delta: float  # auc_b - auc_a
    se: float  # standard error of delta
    z: float  # delta / se (0 when both are 0)
    n: int  # windows used


def delong_components(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sun & Xu's midrank form of DeLong's structural components.

    scores: (M, N) — M score vectors over the same N samples; labels: (N,) bool.
    Returns aucs (M,), v10 (M, m) per positive, v01 (M, n) per negative.
    """
    labels = labels.astype(bool)
    pos, neg = scores[:, labels], scores[:, ~labels]  # (M, m), (M, n)
    m, n = pos.shape[1], neg.shape[1]
    tx = rankdata(pos, axis=1)  # midranks among positives
    ty = rankdata(neg, axis=1)  # midranks among negatives
    tz = rankdata(np.concatenate([pos, neg], axis=1), axis=1)  # midranks among all
    aucs = (tz[:, :m].sum(axis=1) - m * (m + 1) / 2) / (m * n)
    v10 = (tz[:, :m] - tx) / n  # share of negatives each positive beats
    v01 = 1.0 - (tz[:, m:] - ty) / m  # share of positives that beat each negative
    return aucs, v10, v01


def delong_covariance(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AUCs (M,) and their DeLong covariance (M, M)."""
    aucs, v10, v01 = delong_components(scores, labels)
    m, n = v10.shape[1], v01.shape[1]
    s10 = np.atleast_2d(np.cov(v10))  # (M, M)
    s01 = np.atleast_2d(np.cov(v01))
    return aucs, s10 / m + s01 / n


def delong_paired(score_a: np.ndarray, score_b: np.ndarray, labels: np.ndarray) -> PairedTest:
    """DeLong's test of AUC_B − AUC_A on the same samples. Needs ≥ 2 samples of each class."""
    labels = np.asarray(labels).astype(bool)
    m, n = int(labels.sum()), int((~labels).sum())
    if m < 2 or n < 2:
        return PairedTest(float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), len(labels))
    aucs, cov = delong_covariance(np.stack([score_a, score_b]).astype(np.float64), labels)
    delta = float(aucs[1] - aucs[0])
    var = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    se = math.sqrt(max(var, 0.0))
    return PairedTest(float(aucs[0]), float(aucs[1]), delta, se, z_score(delta, se), len(labels))


def thin_by_index(index: np.ndarray, spacing: int) -> np.ndarray:
    """Positions of windows kept when thinning to one per `spacing` snapshots (greedy, in time
    order): a kept window ends at least `spacing` snapshots after the previous kept one."""
    order = np.argsort(index, kind="stable")
    kept, last = [], None
    for pos in order:
        if last is None or index[pos] - last >= spacing:
            kept.append(pos)
            last = index[pos]
    return np.asarray(kept, dtype=np.int64)


# ---------------------------------------------------------------- moving-block bootstrap


def block_length(window: int, h_max: int, stride: int) -> int:
    """Windows per block: enough that windows in different blocks share no snapshot."""
    return max(1, math.ceil((window + h_max) / stride))


def block_counts(n: int, block_len: int, n_boot: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Moving-block resamples as multiplicities, in chunks: yields (R, n) int32 arrays whose row r
    counts how often each window (in time order) appears in resample r. Each resample concatenates
    ceil(n / block_len) blocks with uniform starts, cut to n windows."""
    n_blocks = math.ceil(n / block_len)
    tail = n - (n_blocks - 1) * block_len  # the last block is cut to this length
    done = 0
    while done < n_boot:
        r = min(BOOTSTRAP_CHUNK, n_boot - done)
        starts = rng.integers(0, n - block_len + 1, size=(r, n_blocks))
        lengths = np.full(n_blocks, block_len)
        lengths[-1] = tail
        row0 = (np.arange(r) * (n + 1))[:, None]  # +1 at a block's start, −1 past its end
        diff = np.bincount((row0 + starts).ravel(), minlength=r * (n + 1)).astype(np.int32)
        diff -= np.bincount((row0 + starts + lengths).ravel(), minlength=r * (n + 1)).astype(np.int32)
        yield np.cumsum(diff.reshape(r, n + 1)[:, :n], axis=1, dtype=np.int32)
        done += r


class PresortedAUC:
    """One score vector sorted once, so the AUC of any resample (given as multiplicities) is a few
    linear passes instead of a sort: the weighted count of negatives below each positive is a
    cumulative sum over the negatives in score order, read at positions found once by bisection.
    (Hand-written because no library takes resamples as multiplicities; np.take because fancy
    indexing is ~3x slower on (R, N) arrays.)
    """

    def __init__(self, scores: np.ndarray, labels: np.ndarray, rows: np.ndarray):
        """scores, labels: (n,) of the windows at `rows` (positions in the counts' columns)."""
        labels = labels.astype(bool)
        neg_order = np.argsort(scores[~labels], kind="stable")
        neg_sorted = scores[~labels][neg_order]
        pos_scores = scores[labels]
        self.neg_rows = rows[~labels][neg_order]  # count columns of the negatives, in score order
        self.pos_rows = rows[labels]
        # negatives strictly below / at or below each positive: ties count one half
        self.below_lo = np.searchsorted(neg_sorted, pos_scores, side="left")
        self.below_hi = np.searchsorted(neg_sorted, pos_scores, side="right")

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        """counts: (R, N) multiplicities of all windows -> AUC per resample (R,); NaN where a
        resample has no positive or no negative."""
        r = counts.shape[0]
        cum = np.zeros((r, len(self.neg_rows) + 1), dtype=np.int32)  # cum[:, k]: first k negatives
        np.cumsum(np.take(counts, self.neg_rows, axis=1), axis=1, out=cum[:, 1:])
        pos_c = np.take(counts, self.pos_rows, axis=1)  # (R, m)
        twice_below = np.take(cum, self.below_lo, axis=1)
        twice_below += np.take(cum, self.below_hi, axis=1)
        num = np.einsum("rm,rm->r", pos_c, twice_below, dtype=np.int64) / 2.0
        n_pos = pos_c.sum(axis=1, dtype=np.int64)
        n_neg = cum[:, -1].astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where((n_pos > 0) & (n_neg > 0), num / (n_pos * n_neg), np.nan)


@dataclass(frozen=True)
class BootstrapResult:
    delta: float  # observed AUC_B − AUC_A
    se: float  # std of the resampled deltas
    z: float
    n_resamples: int  # resamples with both classes present
    n_windows: int


def paired_block_bootstrap(
    score_a: np.ndarray,
    score_b: np.ndarray,
    labels: np.ndarray,
    valid: np.ndarray,
    block_len: int,
    n_boot: int,
    rng: np.random.Generator,
) -> list[BootstrapResult]:
    """Paired moving-block bootstrap of AUC_B − AUC_A for every horizon of one fold.

    score_a, score_b, labels, valid: (N, H) over the fold's windows in time order; `valid` masks
    windows whose label exists. Every horizon and both arms see the same resampled blocks, so the
    pairing is exact and the windows are drawn once per fold.
    """
    boot = block_bootstrap_aucs({"a": score_a, "b": score_b}, labels, valid, block_len, n_boot, rng)
    results = []
    for j in range(labels.shape[1]):
        delta = float(boot["b"][0][j] - boot["a"][0][j])
        d = boot["b"][1][:, j] - boot["a"][1][:, j]
        d = d[np.isfinite(d)]
        se = float(d.std(ddof=1)) if len(d) > 1 else float("nan")
        results.append(BootstrapResult(delta, se, z_score(delta, se), int(len(d)), int(valid[:, j].sum())))
    return results


def block_bootstrap_aucs(
    scores: dict,
    labels: np.ndarray,
    valid: np.ndarray,
    block_len: int,
    n_boot: int,
    rng: np.random.Generator,
    enough: bool = True,
) -> dict:
    """Observed and moving-block-resampled AUC of several runs over the same windows of one fold.

    scores: key -> (N, H) probabilities in time order; labels, valid: (N, H). Every run and horizon
    sees the same resampled blocks, so any difference of two runs is an exact paired resample.
    Returns key -> (observed (H,), resampled (n_boot, H), NaN where a resample lacks a class);
    with `enough` false (fewer windows than two blocks) the resamples are all NaN.
    """
    n, h = labels.shape
    keeps = [np.flatnonzero(valid[:, j]) for j in range(h)]
    ys = [labels[k, j].astype(bool) for j, k in enumerate(keeps)]
    out = {}
    for key, s in scores.items():
        observed = np.array([auc(s[keeps[j], j], ys[j]) for j in range(h)])
        out[key] = (observed, np.full((n_boot, h), np.nan))
    if not enough:
        return out
    sorted_runs = {
        key: [PresortedAUC(s[k, j], y, k) for j, (k, y) in enumerate(zip(keeps, ys))] for key, s in scores.items()
    }
    done = 0
    for counts in block_counts(n, block_len, n_boot, rng):  # (chunk, N)
        for key, per_h in sorted_runs.items():
            for j, presorted in enumerate(per_h):
                out[key][1][done : done + len(counts), j] = presorted.resampled(counts)
        done += len(counts)
    return out


# ---------------------------------------------------------------- combining


def stouffer(z: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted Stouffer: Σ w z / sqrt(Σ w²) over the finite z's; NaN when none is finite."""
    z = np.asarray(z, dtype=np.float64)
    w = np.ones_like(z) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = np.isfinite(z) & (w > 0)
    if not ok.any():
        return float("nan")
    return float((w[ok] * z[ok]).sum() / math.sqrt((w[ok] ** 2).sum()))


def one_sided_p(z: float) -> float:
    """P(Z ≥ z) under the null of no lift; NaN stays NaN."""
    return float(norm.sf(z)) if math.isfinite(z) else float("nan")


def z_score(delta: float, se: float) -> float:
    if not (math.isfinite(delta) and math.isfinite(se)):
        return float("nan")
    if se == 0.0:
        return 0.0 if delta == 0.0 else math.copysign(math.inf, delta)
    return delta / se
