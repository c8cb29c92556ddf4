"""Attention mass by lag on the validation set: where in the window each query looks. The study's
hypothesis made visible (short horizons near lag 0, long ones spread over the window)."""

from __future__ import annotations

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
    def __init__(self, window: int, n_queries: int):
        self.edges = lag_edges(window)
        # bucket of each position k in the window: lag = K - 1 - k
        lags = window - 1 - np.arange(window)
        self.bucket_of_k = torch.as_tensor(np.searchsorted(self.edges, lags, side="right") - 1)
        self.sums = torch.zeros(n_queries, len(self.edges) - 1, dtype=torch.float64)
        self.count = 0

    def add(self, attn: torch.Tensor) -> None:
        """attn: (B, Q, K) attention weights, rows summing to 1 over K."""
        a = attn.detach().to("cpu", torch.float64)
        per_bucket = torch.zeros(a.shape[0], a.shape[1], self.sums.shape[1], dtype=torch.float64)
        per_bucket.index_add_(2, self.bucket_of_k, a)  # (B, Q, n_buckets)
        self.sums += per_bucket.sum(0)
        self.count += a.shape[0]

    def mass(self) -> np.ndarray:
        return (self.sums / max(self.count, 1)).numpy().astype(np.float32)  # (Q, n_buckets)


def query_names(n_queries: int, horizons: list[int]) -> list[str]:
    return ["shared"] if n_queries == 1 else [f"h{h}" for h in horizons]


def save_attention_by_lag(out_dir: Path, acc: AttentionByLag, names: list[str], title: str) -> tuple[Path, Path]:
    npz_path, png_path = out_dir / "attention_by_lag.npz", out_dir / "attention_by_lag.png"
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
    ax.set_xticklabels([f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in zip(acc.edges[:-1], acc.edges[1:])],
                       rotation=45, fontsize=7)
    ax.set_xlabel("lag bucket (snapshots before the window's end)")
    ax.set_ylabel("mean attention mass")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return npz_path, png_path
