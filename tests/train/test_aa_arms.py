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


def test_every_fold_and_replicate_starts_from_its_own_init(tmp_path, monkeypatch):
    """The gate's cells must be independent draws of training noise: with one init for every fold the
    twin's lucky head would be ahead in every fold alike, and the folds' agreement would not be evidence."""
    from perception.train.loop import place_of

    monkeypatch.setenv("PERCEPTION_HOME", str(tmp_path))
    seeds = {}
    for arm in ("shared", "shared_twin"):
        for fold in range(3):
            for replicate in range(2):
                cfg = Config(arm=arm, seed=11, sweep_id="cells", replicate=replicate)
                cfg.data.fold = fold
                place_of(cfg)
                seeds[arm, fold, replicate] = int(cfg.seed)
    cells = [(f, r) for f in range(3) for r in range(2)]
    assert len({seeds["shared", f, r] for f, r in cells}) == 6  # every cell its own seed
    assert all(seeds["shared", f, r] == seeds["shared_twin", f, r] for f, r in cells)  # the arms pair up
    assert seeds["shared", 0, 0] == 11 and seeds["shared", 0, 1] == 12  # fold 0 keeps seed + replicate
    trunks = [_split(_model("shared", seeds["shared", f, 0]))[1] for f in range(2)]
    assert any(not torch.equal(trunks[0][k], trunks[1][k]) for k in trunks[0])
