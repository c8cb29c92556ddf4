"""The gate config a sweep decides with is the one its experiment chooses in its Hydra defaults
(`- override /gate: NAME` in conf/experiment/<name>.yaml); an experiment without one is refused by name."""

from __future__ import annotations

import shutil
from importlib import resources

import pytest

from perception.errors import ConfigError
from perception.sweep.overrides import experiment_gate_config, resolve_gate_config
from perception.train import compose
from perception.train.compose import composed


@pytest.mark.parametrize(
    "experiment, gate", [("ci", "ci"), ("local", "local"), ("production", "default"), ("smoke", "smoke")]
)
def test_each_experiment_chooses_its_gate_config_in_its_defaults(experiment, gate):
    cfg = composed([f"experiment={experiment}"])
    assert cfg.gate == gate
    assert experiment_gate_config(cfg) == gate
    assert resolve_gate_config("auto", cfg) == gate


def test_the_default_experiment_chooses_its_gate_config_too():
    assert composed([]).gate == "local"  # conf/config.yaml's default experiment


def test_an_override_chooses_another_gate_config_and_a_given_name_is_kept():
    assert composed(["experiment=production", "gate=shift_viable"]).gate == "shift_viable"
    assert resolve_gate_config("shift_viable", composed(["experiment=production"])) == "shift_viable"


def test_an_unknown_gate_config_names_the_options():
    with pytest.raises(ConfigError, match=r"gate=nope.*no option 'nope'.*shift_viable"):
        composed(["experiment=ci", "gate=nope"])


@pytest.fixture
def conf_with_a_bare_experiment(tmp_path, monkeypatch):
    """The shipped conf/ as another package, plus an experiment whose defaults choose no gate config."""
    conf = tmp_path / "bare_conf"
    shutil.copytree(str(resources.files(compose.CONFIG_MODULE)), conf)
    (conf / "experiment" / "bare.yaml").write_text(
        "# @package _global_\nexperiment_name: bare\ndata:\n  horizons: [2, 5, 10, 20, 40]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compose, "CONFIG_MODULE", "bare_conf")


def test_an_experiment_that_chooses_no_gate_config_is_refused_by_name(conf_with_a_bare_experiment):
    cfg = composed(["experiment=bare"])  # it trains: only a sweep needs a gate config
    assert cfg.experiment_name == "bare" and cfg.gate is None
    with pytest.raises(ConfigError) as err:
        resolve_gate_config("auto", cfg)
    message = str(err.value)
    assert "experiment 'bare' chooses no gate config" in message
    assert "`- override /gate: NAME`" in message and "conf/experiment/bare.yaml" in message
    assert "shift_viable" in message  # the gate configs there are to choose from
    assert resolve_gate_config("ci", cfg) == "ci"  # an explicit choice still needs none
    assert composed(["experiment=bare", "gate=ci"]).gate == "ci"
