"""One epoch's steps read each loss one step late and still account for every step, and a
non-finite loss ends the epoch naming its batch."""

from __future__ import annotations

import pytest
import torch

from perception.data.loader import Batch
from perception.model import masked_bce
from perception.train.diagnostics import GradNorms
from perception.train.epoch import train_epoch


class Tiny(torch.nn.Module):
    """logits from the window's mean: parameters under pool., head. (as the grad-norm groups expect)."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x, dt):
        return self.head(torch.tanh(self.pool(x.mean(1))))


def batches(n: int, poison_at: int | None = None) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x = torch.randn(5, 6, 3, generator=g)
        if i == poison_at:
            x[0, 0, 0] = float("nan")
        out.append(
            Batch(
                x=x,
                dt=torch.ones(5, 6),
                y=(torch.rand(5, 2, generator=g) > 0.5).float(),
                mask=torch.ones(5, 2, dtype=torch.bool),
                index=torch.arange(5),
            )
        )
    return out


def run(data: list[Batch], lr: float = 0.0):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    norms = GradNorms(model)
    totals = train_epoch(
        model,
        data,
        opt,
        sched,
        masked_bce,
        precision="fp32",
        device=torch.device("cpu"),
        grad_clip=1.0,
        epoch=3,
        grad_norms=norms,
    )
    return model, totals, norms


def test_every_step_counted_with_its_own_loss():
    data = batches(4)
    model, totals, _ = run(data, lr=0.0)  # lr 0: each loss is the fixed model's
    with torch.no_grad():
        want = [float(masked_bce(model(b.x, b.dt), b.y, b.mask)) for b in data]
    assert totals.steps == 4 and totals.seen == 20
    assert totals.loss_sum == pytest.approx(sum(want), rel=1e-6)
    assert totals.mean_loss == pytest.approx(sum(want) / 4, rel=1e-6)
    assert totals.seconds > 0 and totals.samples_per_s == pytest.approx(20 / totals.seconds)


def test_the_steps_train_and_the_grad_norms_average_over_them():
    model, totals, norms = run(batches(3), lr=0.5)
    assert norms.steps == totals.steps == 3
    means = norms.means()
    assert means["grad_norm_pool_query"] > 0 and means["grad_norm_heads"] > 0 and means["grad_norm_vsn"] == 0
    torch.manual_seed(0)
    assert not torch.equal(model.head.weight, Tiny().head.weight)  # lr 0.5: the steps moved it


def test_a_non_finite_loss_names_its_batch():
    with pytest.raises(FloatingPointError, match="training loss is nan at epoch 3, batch 2"):
        run(batches(5, poison_at=2))
