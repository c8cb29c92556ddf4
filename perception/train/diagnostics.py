"""What the pool learned: attention mass by lag on the validation set (where in the window each query
looks: the study's hypothesis made visible), and the learning-signal diagnostics every run logs per
epoch (gradient norms per module group, query divergence, attention entropy, query drift)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from perception.atomic import atomic_path


def lag_edges(window: int) -> np.ndarray:
    """Bucket edges in snapshots back from the window's last snapshot: [0, 1, 2, 4, 8, ..., K]."""
    edges = [0, 1]
    while edges[-1] < window:
        edges.append(min(edges[-1] * 2, window))
    return np.asarray(edges, dtype=np.int64)


class AttentionByLag:
    """Mean attention mass per lag bucket, summed where the attention is (on its device, float64):
    a validation pass then moves no (B, Q, K) tensor to the host and waits on none."""

    def __init__(self, window: int, n_queries: int):
        self.edges = lag_edges(window)
        # bucket of each position k in the window: lag = K - 1 - k
        lags = window - 1 - np.arange(window)
        self.bucket_of_k = torch.as_tensor(np.searchsorted(self.edges, lags, side="right") - 1)
        self.sums = torch.zeros(n_queries, len(self.edges) - 1, dtype=torch.float64)
        self.count = 0

    def add(self, attn: torch.Tensor) -> None:
        """attn: (B, Q, K) attention weights, rows summing to 1 over K."""
        a = attn.detach().double()
        if self.sums.device != a.device:
            self.sums, self.bucket_of_k = self.sums.to(a.device), self.bucket_of_k.to(a.device)
        per_bucket = torch.zeros(a.shape[0], a.shape[1], self.sums.shape[1], dtype=torch.float64, device=a.device)
        per_bucket.index_add_(2, self.bucket_of_k, a)  # (B, Q, n_buckets)
        self.sums += per_bucket.sum(0)
        self.count += a.shape[0]

    def mass(self) -> np.ndarray:
        return (self.sums / max(self.count, 1)).cpu().numpy().astype(np.float32)  # (Q, n_buckets)


def query_names(n_queries: int, horizons: list[int]) -> list[str]:
    return ["shared"] if n_queries == 1 else [f"h{h}" for h in horizons]


def save_attention_by_lag(npz_path: Path, png_path: Path, acc: AttentionByLag, names: list[str], title: str) -> None:
    mass = acc.mass()
    with atomic_path(npz_path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, lag_edges=acc.edges, mass=mass, query_names=np.asarray(names))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    widths = np.diff(acc.edges).astype(float)
    for q, name in enumerate(names):
        ax.step(np.arange(len(widths)), mass[q], where="mid", label=name)
    ax.set_xticks(np.arange(len(widths)))
    ax.set_xticklabels(
        [f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in zip(acc.edges[:-1], acc.edges[1:])],
        rotation=45,
        fontsize=7,
    )
    ax.set_xlabel("lag bucket (snapshots before the window's end)")
    ax.set_ylabel("mean attention mass")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- learning signal (DESIGN §6)

GRAD_GROUPS = {"pool_query": "pool.", "vsn": "vsn.", "mamba": "mamba.", "cfc": "cfc.", "heads": "head."}


class GradNorms:
    """Mean over an epoch's steps of each parameter group's gradient L2 norm, before clipping:
    `grad_norm_pool_query` shows whether the pool query learns at all (the shared arm's gets ~0,
    since the CfC forgets h_0), the trunk groups give the scale to judge it against."""

    def __init__(self, model: torch.nn.Module):
        self.groups = {
            g: [p for n, p in model.named_parameters() if n.startswith(prefix)] for g, prefix in GRAD_GROUPS.items()
        }
        self.device = next(model.parameters()).device
        self.sums: torch.Tensor | None = None  # (groups,) float64 on the model's device: no sync per step
        self.steps = 0

    def add(self) -> None:
        norms = []
        for params in self.groups.values():
            grads = [p.grad.detach().float().pow(2).sum() for p in params if p.grad is not None]
            norms.append(torch.stack(grads).sum().sqrt() if grads else torch.zeros((), device=self.device))
        step = torch.stack(norms).double()
        self.sums = step if self.sums is None else self.sums + step
        self.steps += 1

    def means(self) -> dict[str, float]:
        sums = self.sums.tolist() if self.sums is not None else [0.0] * len(self.groups)
        return {f"grad_norm_{g}": s / max(self.steps, 1) for g, s in zip(self.groups, sums)}


class AttentionStats:
    """Per validation window: the queries' mean pairwise Jensen–Shannon divergence (nats; 0 for one
    query) and each query's attention entropy over log K (1 = uniform). Per window, not averaged by
    lag first: two queries can read different content and still share a by-lag profile."""

    def __init__(self):
        self.divergence = torch.zeros((), dtype=torch.float64)  # on the attention's device once added to
        self.entropy_ratio = torch.zeros((), dtype=torch.float64)
        self.windows = 0

    def add(self, attn: torch.Tensor) -> None:
        """attn: (B, Q, K) attention weights, rows summing to 1 over K."""
        a = attn.detach().double().clamp_min(1e-30)  # (B, Q, K)
        b, q, k = a.shape
        entropy = -(a * a.log()).sum(-1)  # (B, Q)
        ratio = (entropy / math.log(k)).mean(-1).sum() if k > 1 else torch.tensor(float(b), dtype=torch.float64)
        self.entropy_ratio = self.entropy_ratio.to(a.device) + ratio.to(a.device)
        if q > 1:
            i, j = torch.triu_indices(q, q, offset=1, device=a.device)
            p, r = a[:, i], a[:, j]  # (B, pairs, K)
            m = 0.5 * (p + r)
            js = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (r * (r / m).log()).sum(-1)  # (B, pairs)
            self.divergence = self.divergence.to(a.device) + js.mean(-1).sum()
        self.windows += b

    def metrics(self) -> dict[str, float]:
        n = max(self.windows, 1)
        return {
            "query_divergence": float(self.divergence) / n,
            "attention_entropy_ratio": float(self.entropy_ratio) / n,
        }


def query_drift(query: torch.Tensor, initial: torch.Tensor) -> float:
    """Mean over queries of ‖q − q_init‖ / ‖q_init‖: how far each query moved from its start."""
    q, q0 = query.detach().float().cpu(), initial.detach().float().cpu()  # (Q, D)
    return float(((q - q0).norm(dim=-1) / q0.norm(dim=-1).clamp_min(1e-12)).mean())
