"""`arm=NAME` chooses a run's model configuration; the model fields it sets (`model.attention_pool`,
`model.shared_context_to_heads`, `model.twin`) given alone are an alias naming their arm, and given beside
an arm they disagree with, a ConfigError naming both, before any work."""

from __future__ import annotations

import json

import pytest

from perception.arms import ARM_FIELDS, get_arm
from perception.errors import ConfigError
from perception.model import ModelConfig, PerceptionModel
from perception.model.checkpoint import save_model
from perception.train.compose import composed
from perception.train.config import Config, apply_arm
from perception.train.state import CHECKPOINTS, LATEST, MODEL_FILE, STATE_FILE
from tests.train.helpers import cli

ALIASES = [
    ([], "shared"),
    (["model.attention_pool=per_horizon"], "per_horizon"),
    (["model.attention_pool=shared"], "shared"),
    (["model.shared_context_to_heads=true"], "shared_skip"),
    (["model.twin=true"], "shared_twin"),
    (["model.attention_pool=per_horizon", "model.twin=true"], "per_horizon_twin"),
    (["arm=per_horizon", "model.attention_pool=per_horizon"], "per_horizon"),  # agreeing: no error
    (["arm=shared_skip_twin", "model.twin=true", "model.shared_context_to_heads=true"], "shared_skip_twin"),
]


@pytest.mark.parametrize("overrides,arm", ALIASES, ids=[" ".join(a[0]) or "(none)" for a in ALIASES])
def test_model_fields_alone_name_their_arm(overrides, arm):
    cfg = composed(overrides, checked=True)
    assert apply_arm(cfg) == arm and cfg.arm == arm
    chosen = get_arm(arm).model_fields()
    assert {key: getattr(cfg.model, key) for key in ARM_FIELDS} == chosen


@pytest.mark.parametrize("arm", ["shared", "per_horizon", "shared_skip", "per_horizon_twin"])
def test_the_arm_sets_its_model_fields(arm):
    cfg = composed([f"arm={arm}"], checked=True)
    assert all(getattr(cfg.model, key) is None for key in ARM_FIELDS)  # the arm's, until applied
    assert apply_arm(cfg) == arm
    assert {key: getattr(cfg.model, key) for key in ARM_FIELDS} == get_arm(arm).model_fields()


CONTRADICTIONS = [
    (["arm=shared", "model.attention_pool=per_horizon"], "model.attention_pool=shared", "arm=per_horizon"),
    (["arm=per_horizon", "model.attention_pool=shared"], "model.attention_pool=per_horizon", "arm=shared"),
    (["arm=shared_skip", "model.shared_context_to_heads=false"], "model.shared_context_to_heads=true", "arm=shared,"),
    (["arm=per_horizon_twin", "model.twin=false"], "model.twin=true", "arm=per_horizon,"),
    (["arm=shared_reseed", "model.twin=true"], "model.twin=false", "arm=shared_twin"),
]


@pytest.mark.parametrize("overrides,arm_has,instead", CONTRADICTIONS, ids=[" ".join(c[0]) for c in CONTRADICTIONS])
def test_a_model_field_that_disagrees_with_the_arm_is_refused_naming_both(overrides, arm_has, instead):
    with pytest.raises(ConfigError) as caught:
        composed(overrides, checked=True)
    message = str(caught.value)
    for given in overrides:
        assert given in message, message
    assert f"has {arm_has}" in message and f"choose {instead}" in message, message
    cfg = composed(overrides)  # unchecked: applying the arm refuses it too, never overriding the field
    with pytest.raises(ConfigError, match="disagree"):
        apply_arm(cfg)
    assert cfg.arm == overrides[0].split("=")[1]


def test_a_contradiction_without_an_arm_to_suggest_names_both():
    with pytest.raises(ConfigError, match=r"arm=shared_skip and model.attention_pool=per_horizon disagree") as caught:
        composed(["arm=shared_skip", "model.attention_pool=per_horizon"], checked=True)
    assert "choose arm=" not in str(caught.value)  # no arm is shared_skip's fields with a per-horizon pool


def test_model_fields_that_name_no_arm_are_refused():
    with pytest.raises(
        ConfigError, match=r"model.attention_pool=per_horizon model.shared_context_to_heads=true: no arm"
    ):
        composed(["model.attention_pool=per_horizon", "model.shared_context_to_heads=true"], checked=True)


def test_a_config_built_by_hand_is_held_to_the_same_rule():
    assert apply_arm(Config(model=ModelConfig(attention_pool="per_horizon"))) == "per_horizon"
    with pytest.raises(ConfigError, match="arm=shared and model.attention_pool=per_horizon disagree"):
        apply_arm(Config(arm="shared", model=ModelConfig(attention_pool="per_horizon")))
    with pytest.raises(ConfigError, match="model.attention_pool='bogus'.*shared, per_horizon"):
        apply_arm(Config(model=ModelConfig(attention_pool="bogus")))


def test_perception_train_refuses_a_contradiction_before_any_work(perception_home):
    res = cli(
        "perception-train", "experiment=ci", "arm=shared", "model.attention_pool=per_horizon", home=perception_home
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "arm=shared and model.attention_pool=per_horizon disagree" in res.stderr, res.stderr[-1500:]
    assert not (perception_home / "runs").exists() and not (perception_home / "hydra").exists()


@pytest.mark.parametrize("choice", ["arm=per_horizon", "model.attention_pool=per_horizon"])
def test_perception_train_takes_the_alias_as_the_arm(perception_home, choice):
    """Either spelling trains the per_horizon arm in its run directory: there, a shared checkpoint is
    refused as one the arm cannot resume (which ends the run before it trains anything)."""
    checkpoint = perception_home / "runs" / "s1" / "per_horizon-f0" / CHECKPOINTS / "ep1"
    checkpoint.mkdir(parents=True)
    save_model(checkpoint / MODEL_FILE, PerceptionModel(ModelConfig(d_model=16), 3, [2], 0))
    (checkpoint / STATE_FILE).write_bytes(b"")
    (checkpoint.parent / LATEST).write_text(json.dumps({"dir": checkpoint.name}))
    res = cli("perception-train", "experiment=ci", "sweep_id=s1", choice, home=perception_home)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "cannot resume arm=per_horizon (a per_horizon pool)" in res.stderr, res.stderr[-1500:]
    assert "it is a shared checkpoint" in res.stderr, res.stderr[-1500:]


def test_a_run_resumed_with_another_seed_is_refused(perception_home):
    """Fold 1 of a sweep started before each fold had its own seed trained from `seed + replicate`: resumed
    now its seed would change (batch order, the logged param), so it is refused, naming both seeds."""
    run_dir = perception_home / "runs" / "s2" / "shared-f1"
    checkpoint = run_dir / CHECKPOINTS / "ep1"
    checkpoint.mkdir(parents=True)
    save_model(checkpoint / MODEL_FILE, PerceptionModel(ModelConfig(d_model=16), 3, [2], 0))
    (checkpoint / STATE_FILE).write_bytes(b"")
    (checkpoint.parent / LATEST).write_text(json.dumps({"dir": checkpoint.name}))
    (run_dir / "config.yaml").write_text("seed: 0\n")
    res = cli("perception-train", "experiment=ci", "sweep_id=s2", "data.fold=1", home=perception_home)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "it started with seed 0" in res.stderr and "this run's seed is 100003" in res.stderr, res.stderr[-1500:]
