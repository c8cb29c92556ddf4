"""Validation pass: loss, per-horizon AUC (perception.metrics), predictions and attention by lag."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from perception.data.prefetch import prefetched
from perception.metrics import auc
from perception.train.diagnostics import AttentionByLag, AttentionStats
from perception.train.precision import forward_context


@dataclass
class Evaluation:
    loss: float
    auc: dict[int, float]  # horizon -> AUC (nan where a horizon has one class only)
    probs: np.ndarray  # (N, H) float32
    labels: np.ndarray  # (N, H) uint8
    mask: np.ndarray  # (N, H) bool
    index: np.ndarray  # (N,) int64 window ends
    attention: AttentionByLag
    attention_stats: AttentionStats

    @property
    def auc_mean(self) -> float:
        finite = [v for v in self.auc.values() if math.isfinite(v)]
        return float(np.mean(finite)) if finite else float("nan")


def per_horizon_auc(probs: np.ndarray, labels: np.ndarray, mask: np.ndarray, horizons: list[int]) -> dict[int, float]:
    out = {}
    for j, h in enumerate(horizons):
        y, p = labels[mask[:, j], j], probs[mask[:, j], j]
        out[h] = auc(p, y)
    return out


@torch.no_grad()
def evaluate(
    model, loader, loss_fn, horizons: list[int], window: int, device: torch.device, precision: str = "fp32"
) -> Evaluation:
    model.eval()
    acc, attn_stats = AttentionByLag(window, model.n_queries), AttentionStats()
    probs, labels, masks, index = [], [], [], []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # on the device: no batch waits for the host
    n_valid = torch.zeros((), dtype=torch.int64, device=device)
    with prefetched(loader.batches(0), device) as batches:
        for batch in batches:
            with forward_context(precision, device):
                logits, attn = model(batch.x, batch.dt, return_attention=True)
            valid = batch.mask.sum()
            loss_sum += loss_fn(logits, batch.y, batch.mask).double() * valid  # 0 where no label is valid
            n_valid += valid
            attn = attn.detach().double()  # once for both accumulators, on the device (B, Q, K)
            acc.add(attn)
            attn_stats.add(attn)
            probs.append(torch.sigmoid(logits).float())  # (B, H) each, to the host once at the end
            labels.append(batch.y)
            masks.append(batch.mask)
            index.append(batch.index.numpy().astype(np.int64))
    model.train()
    probs_a = torch.cat(probs).cpu().numpy()
    labels_a = torch.cat(labels).cpu().numpy().astype(np.uint8)
    mask_a = torch.cat(masks).cpu().numpy().astype(bool)
    return Evaluation(
        loss=float(loss_sum) / max(int(n_valid), 1),
        auc=per_horizon_auc(probs_a, labels_a, mask_a, horizons),
        probs=probs_a.astype(np.float32),
        labels=labels_a,
        mask=mask_a,
        index=np.concatenate(index),
        attention=acc,
        attention_stats=attn_stats,
    )
