"""trainer.query_lr_scale: the pool query's own learning rate, every arm alike."""

from __future__ import annotations

import pytest
import torch

from perception.model import ModelConfig, PerceptionModel
from perception.train.loop import _param_groups


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
def test_the_query_gets_its_own_rate_and_one_group_stays_the_old_layout(variant):
    model = PerceptionModel(ModelConfig(attention_pool=variant, d_model=16), n_features=4, horizons=[2, 5], seed=0)
    (one,) = _param_groups(model, 1e-3, 1e-3)
    assert len(one["params"]) == len(list(model.parameters()))  # checkpoints from before still resume
    rest, query = _param_groups(model, 3e-2, 1e-3)
    assert query["params"] == [model.pool.query] and query["lr"] == 3e-2
    assert len(rest["params"]) + 1 == len(list(model.parameters()))
    opt = torch.optim.AdamW([rest, query], lr=1e-3)
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 3e-2]
