"""Overrides are checked against the schema: unknown keys and options get the nearest known ones, and
`+` adds a key only under a mapping field."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from perception.errors import ConfigError
from perception.train.config import Config
from perception.train.override_keys import check_override_keys, nearest, schema_keys


@dataclass
class Inner:
    epochs: int = 1
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Schema:
    seed: int = 0
    trainer: Inner = field(default_factory=Inner)


GROUPS = {"trainer": ["default", "fast"]}


def test_schema_keys_lists_nodes_leaves_and_the_open_mappings():
    keys, open_maps = schema_keys(Schema)
    assert keys == {"seed", "trainer", "trainer.epochs", "trainer.weights"}
    assert open_maps == {"trainer.weights"}


def test_plus_adds_a_key_under_a_mapping_field_only():
    check_override_keys(["+trainer.weights.h10=0.5", "++trainer.weights.h20=1"], Schema, GROUPS)
    with pytest.raises(
        ConfigError,
        match=r"'\+' cannot add one: trainer takes only its own keys "
        r"\(new keys are allowed under trainer.weights\); did you mean trainer.epochs\?",
    ):
        check_override_keys(["+trainer.epoch=1"], Schema, GROUPS)


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.epoch=1", "the config has no key trainer.epoch; did you mean trainer.epochs?"),
        ("epochs=1", "did you mean trainer.epochs?"),
        ("trainer.zzz=1", "the keys under trainer are: epochs, weights"),
        ("zzz.qqq=1", "the keys at the top level are: seed, trainer"),
        ("~trainer.epoch", "did you mean trainer.epochs?"),
        ("+trainer.epochs=2", "trainer.epochs exists already; set it without '+': trainer.epochs=2"),
        ("trainer=fats", "trainer has no option 'fats'; did you mean trainer=fast? (options: default, fast)"),
    ],
)
def test_a_mistake_names_the_override_and_the_nearest_known(override, message):
    with pytest.raises(ConfigError) as err:
        check_override_keys([override], Schema, GROUPS)
    assert message in str(err.value) and repr(override) in str(err.value)


def test_known_keys_options_sweeps_and_hydra_keys_pass():
    check_override_keys(
        [
            "seed=1",
            "trainer.epochs=2",
            "trainer=fast",
            "trainer.epochs=1,2",
            "hydra.job.chdir=false",
            "hydra/launcher=basic",
        ],
        Schema,
        GROUPS,
    )


def test_the_training_config_refuses_plus_everywhere():
    """No field of the training config is a mapping, so `+` never adds a key there."""
    assert schema_keys(Config)[1] == set()
    assert nearest("trainer.epoch", sorted(schema_keys(Config)[0])) == ["trainer.epochs"]
