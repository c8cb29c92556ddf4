"""One epoch's training steps: forward at the run's precision, the loss, backward, gradient norms,
clipping, AdamW and the schedule, over batches already on the device (`perception.data.prefetched`).

No step waits for the host on a GPU: each step's loss is read one step late, once the next step is
queued behind it, and the gradient norms add up on the device. A non-finite loss still ends the run,
naming the batch it came from (the step after it has been queued by then, never its checkpoint)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

from perception.data.loader import Batch
from perception.train.diagnostics import GradNorms
from perception.train.precision import forward_context


@dataclass
class EpochTotals:
    seen: int = 0  # windows trained on
    steps: int = 0
    loss_sum: float = 0.0
    seconds: float = 0.0  # wall time, every queued step finished

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.steps, 1)

    @property
    def samples_per_s(self) -> float:
        return self.seen / max(self.seconds, 1e-9)


def train_epoch(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
    scheduler,
    loss_fn: Callable,
    *,
    precision: str,
    device: torch.device,
    grad_clip: float,
    epoch: int,
    grad_norms: Optional[GradNorms] = None,
    bar=None,
    after_step: Optional[Callable[[], object]] = None,
) -> EpochTotals:
    totals, t0 = EpochTotals(), time.perf_counter()
    pending: Optional[tuple[int, torch.Tensor, int]] = None  # (batch number, loss, windows) of the step before

    def settle(i: int, loss: torch.Tensor, n: int) -> None:
        value = float(loss)  # waits for that step only: the next one is already queued
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss is {value} at epoch {epoch}, batch {i}")
        totals.seen, totals.steps, totals.loss_sum = totals.seen + n, totals.steps + 1, totals.loss_sum + value
        if bar is not None:
            rate = totals.seen / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(loss=f"{totals.mean_loss:.4f}", samples_s=f"{rate:.0f}")
            bar.update(1)
        if after_step is not None:
            after_step()

    for i, batch in enumerate(batches):
        with forward_context(precision, device):
            logits = model(batch.x, batch.dt)
        loss = loss_fn(logits, batch.y, batch.mask)  # fp32 logits: the heads run in fp32 at every precision
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_norms is not None:
            grad_norms.add()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        scheduler.step()
        if pending is not None:
            settle(*pending)
        pending = (i, loss.detach(), batch.x.shape[0])
    if pending is not None:
        settle(*pending)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the last optimizer step too
    totals.seconds = time.perf_counter() - t0
    return totals
