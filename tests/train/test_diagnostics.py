"""The validation pass's attention diagnostics: values against direct computations, accumulation
over batches, and the same values where the attention lives on a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from perception.train.diagnostics import AttentionByLag, AttentionStats, lag_edges


def random_attention(b: int, q: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(b, q, k, generator=g), dim=-1)  # (B, Q, K)


def direct_stats(a: np.ndarray) -> tuple[float, float]:
    """Mean over windows of the mean pairwise JS divergence, and of the entropy over log K."""
    b, q, k = a.shape
    a = np.maximum(a.astype(np.float64), 1e-30)
    entropy = -(a * np.log(a)).sum(-1) / math.log(k)
    js = []
    for w in range(b):
        pairs = []
        for i in range(q):
            for j in range(i + 1, q):
                m = 0.5 * (a[w, i] + a[w, j])
                pairs.append(0.5 * (a[w, i] * np.log(a[w, i] / m)).sum() + 0.5 * (a[w, j] * np.log(a[w, j] / m)).sum())
        js.append(np.mean(pairs) if pairs else 0.0)
    return float(np.mean(js)), float(entropy.mean())


def test_stats_match_a_direct_computation_across_batches():
    a = random_attention(6, 5, 40)
    stats = AttentionStats()
    stats.add(a[:4])
    stats.add(a[4:])
    divergence, entropy = direct_stats(a.numpy())
    m = stats.metrics()
    assert m["query_divergence"] == pytest.approx(divergence, rel=1e-9)
    assert m["attention_entropy_ratio"] == pytest.approx(entropy, rel=1e-9)


def test_stats_at_the_extremes():
    k = 8
    uniform = torch.full((3, 1, k), 1 / k)
    stats = AttentionStats()
    stats.add(uniform)
    assert stats.metrics() == pytest.approx({"query_divergence": 0.0, "attention_entropy_ratio": 1.0})
    disjoint = torch.zeros(2, 2, k)
    disjoint[:, 0, 0] = disjoint[:, 1, 1] = 1.0  # two queries, each on its own position
    stats = AttentionStats()
    stats.add(disjoint)
    assert stats.metrics()["query_divergence"] == pytest.approx(math.log(2), rel=1e-9)
    assert stats.metrics()["attention_entropy_ratio"] == pytest.approx(0.0, abs=1e-9)


def test_mass_by_lag_buckets_the_positions_from_the_window_end():
    k = 20
    a = random_attention(5, 3, k, seed=1)
    acc = AttentionByLag(k, 3)
    acc.add(a[:2])
    acc.add(a[2:])
    edges = lag_edges(k)
    lags = k - 1 - np.arange(k)
    bucket = np.searchsorted(edges, lags, side="right") - 1
    want = (
        np.stack(
            [
                np.bincount(bucket, weights=a[:, q].numpy().astype(np.float64).sum(0), minlength=len(edges) - 1)
                for q in range(3)
            ]
        )
        / 5
    )
    np.testing.assert_allclose(acc.mass(), want, rtol=1e-6)
    np.testing.assert_allclose(acc.mass().sum(1), 1.0, rtol=1e-6)
    last = torch.zeros(1, 3, k)
    last[..., -1] = 1.0  # all mass on the window's last snapshot: lag 0, the first bucket
    only = AttentionByLag(k, 3)
    only.add(last)
    assert only.mass()[:, 0].tolist() == [1.0, 1.0, 1.0] and only.mass()[:, 1:].sum() == 0


@pytest.mark.cuda
def test_the_same_values_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a = random_attention(6, 5, 300, seed=2)
    on = {}
    for device in ("cpu", "cuda"):
        stats, acc = AttentionStats(), AttentionByLag(300, 5)
        for part in (a[:3], a[3:]):
            stats.add(part.to(device))
            acc.add(part.to(device))
        on[device] = (stats.metrics(), acc.mass())
    assert on["cuda"][0] == pytest.approx(on["cpu"][0], rel=1e-12)
    np.testing.assert_allclose(on["cuda"][1], on["cpu"][1], rtol=1e-6)
