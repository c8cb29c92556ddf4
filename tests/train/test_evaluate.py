"""The validation pass: its loss is the mean BCE over every valid label of the split (not a mean of batch
means), its predictions are the model's in the loader's order, and on a GPU it gives the CPU's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perception.data import WindowLoader
from perception.model import ModelConfig, PerceptionModel, masked_bce
from perception.model.config import AttentionPoolVariant
from perception.train.evaluate import evaluate, per_horizon_auc
from tests.conftest import SMALL_BOOK

CFG = SMALL_BOOK


@pytest.fixture
def prepared(small_book):
    return small_book


def val_loader(prepared, batch_size: int) -> WindowLoader:
    ds, split, norm = prepared
    return WindowLoader(ds, split.val_ends, CFG.window, batch_size, normalizer=norm, shuffle=False)


def model_for(prepared, variant: str = "per_horizon") -> PerceptionModel:
    ds = prepared[0]
    return PerceptionModel(
        ModelConfig(d_model=16, ops="ref", attention_pool=AttentionPoolVariant(variant)),
        n_features=ds.features.shape[1],
        horizons=CFG.horizons,
        seed=3,
    )


def whole_split(prepared):
    """Every validation window in one batch: x, dt, y, mask, index."""
    (batch,) = val_loader(prepared, len(prepared[1].val_ends)).batches(0)
    return batch


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
def test_loss_and_predictions_are_those_of_the_whole_split(prepared, variant):
    model = model_for(prepared, variant)
    ev = evaluate(model, val_loader(prepared, 7), masked_bce, CFG.horizons, CFG.window, torch.device("cpu"))
    whole = whole_split(prepared)
    assert len(whole.index) % 7 != 0  # a short last batch: a mean of batch means would be off
    with torch.no_grad():
        logits = model(whole.x, whole.dt)
    assert ev.loss == pytest.approx(float(masked_bce(logits, whole.y, whole.mask)), rel=1e-5)
    np.testing.assert_array_equal(ev.index, whole.index.numpy())
    np.testing.assert_array_equal(ev.labels, whole.y.numpy().astype(np.uint8))
    np.testing.assert_array_equal(ev.mask, whole.mask.numpy().astype(bool))
    np.testing.assert_allclose(ev.probs, torch.sigmoid(logits).numpy(), rtol=1e-5, atol=1e-6)
    assert ev.auc == pytest.approx(
        per_horizon_auc(torch.sigmoid(logits).numpy(), ev.labels, ev.mask, CFG.horizons), abs=1e-6
    )
    assert ev.attention.mass().shape[0] == model.n_queries
    assert model.training  # handed back in training mode


@pytest.mark.cuda
def test_the_same_evaluation_on_the_gpu(prepared):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    on = {}
    for device in ("cpu", "cuda"):
        model = model_for(prepared).to(device)
        on[device] = evaluate(
            model, val_loader(prepared, 7), masked_bce, CFG.horizons, CFG.window, torch.device(device)
        )
    cpu, gpu = on["cpu"], on["cuda"]
    np.testing.assert_array_equal(gpu.index, cpu.index)
    np.testing.assert_array_equal(gpu.labels, cpu.labels)
    np.testing.assert_array_equal(gpu.mask, cpu.mask)
    np.testing.assert_allclose(gpu.probs, cpu.probs, rtol=1e-4, atol=1e-5)
    assert gpu.loss == pytest.approx(cpu.loss, rel=1e-4)
    assert gpu.auc == pytest.approx(cpu.auc, abs=1e-3)
    np.testing.assert_allclose(gpu.attention.mass(), cpu.attention.mass(), rtol=1e-4, atol=1e-6)
