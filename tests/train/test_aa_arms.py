"""The A/A arms: a twin shares the trunk's init and reseeds only the pool query and heads; a reseeded
arm trains from another seed altogether."""

from __future__ import annotations

import pytest
import torch

from perception.arms import RESEED_OFFSET, arm_names, get_arm
from perception.model import ModelConfig, PerceptionModel
from perception.model.model import ARM_MODULES
from perception.train.config import Config, apply_arm


def _model(arm: str, seed: int) -> PerceptionModel:
    cfg = Config(arm=arm, seed=seed, model=ModelConfig(d_model=16))
    apply_arm(cfg)
    return PerceptionModel(cfg.model, n_features=4, horizons=[2, 5], seed=int(cfg.seed))


def _split(model: PerceptionModel) -> tuple[dict, dict]:
    arm_part, trunk = {}, {}
    for name, p in model.state_dict().items():
        (arm_part if name.split(".")[0] in ARM_MODULES else trunk)[name] = p
    return arm_part, trunk


@pytest.mark.parametrize("base", ["shared", "per_horizon"])
def test_a_twin_shares_the_trunk_and_reseeds_pool_and_heads(base):
    (arm_a, trunk_a), (arm_b, trunk_b) = _split(_model(base, 3)), _split(_model(base + "_twin", 3))
    assert trunk_a and arm_a
    assert all(torch.equal(trunk_a[k], trunk_b[k]) for k in trunk_a)
    assert any(not torch.equal(arm_a[k], arm_b[k]) for k in arm_a)


def test_a_reseeded_arm_trains_from_another_seed_altogether():
    cfg = Config(arm="shared_reseed", seed=3)
    assert apply_arm(cfg) == "shared_reseed" and cfg.seed == 3 + RESEED_OFFSET and not cfg.model.twin
    (_, trunk_a), (_, trunk_b) = _split(_model("shared", 3)), _split(_model("shared_reseed", 3))
    assert any(not torch.equal(trunk_a[k], trunk_b[k]) for k in trunk_a)
    assert get_arm("per_horizon_reseed").attention_pool == "per_horizon"
    assert {"shared_reseed", "shared_skip_reseed", "shared_twin"} <= set(arm_names())
