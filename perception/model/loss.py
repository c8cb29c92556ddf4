"""Masked multi-horizon BCE (DESIGN §3)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def masked_bce(
    logits: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """logits, y, mask: (B, H); weights: (H,) or None -> scalar.
    Mean of BCE-with-logits over the valid (b, h); with weights, the weighted mean
    sum(w_h l m) / sum(w_h m). No valid entry gives 0 (still attached to the graph)."""
    if y.shape != logits.shape or mask.shape != logits.shape:
        raise ValueError(
            f"masked_bce: logits {tuple(logits.shape)}, y {tuple(y.shape)} and mask "
            f"{tuple(mask.shape)} must have the same (B, H) shape"
        )
    m = mask.to(logits.dtype)
    if weights is not None:
        weights = torch.as_tensor(weights, dtype=logits.dtype, device=logits.device)
        if weights.shape != logits.shape[-1:]:
            raise ValueError(
                f"masked_bce: weights {tuple(weights.shape)} must have one value per horizon ({logits.shape[-1]})"
            )
        m = m * weights
    loss = F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype), reduction="none")
    # clamp instead of a branch: no host sync, and 0 / tiny = 0 when nothing is valid
    return (loss * m).sum() / m.sum().clamp_min(torch.finfo(logits.dtype).tiny)
