"""Config errors fail before any work (exit 2), naming the key and what is allowed."""

from __future__ import annotations

import shutil

import pytest

from tests.train.helpers import cli

CASES = [
    (["model.attention_pool=bogus"], ["attention_pool", "shared", "per_horizon"]),
    (["data.fold=3"], ["data.fold", "0"]),
    (["data.fold=-1"], ["data.fold"]),
    (["data.horizons=[30,10,100,300,1000]"], ["data.horizons", "ascending"]),
    (["data.window=100000"], ["data.window"]),
    (["data.horizons=[10,30,100,300,100000]"], ["data.horizons"]),
    (["data=dbn", "data.paths=[/nonexistent/file.dbn.zst]"], ["/nonexistent/file.dbn.zst"]),
    (["trainer.epochs=0"], ["trainer.epochs"]),
    (["trainer.init_from=/nonexistent/model.safetensors"], ["trainer.init_from"]),
    (["arm=bogus"], ["arm 'bogus'", "shared_skip", "shared_twin"]),
    (["trainer.query_lr_scale=0"], ["trainer.query_lr_scale"]),
    (["data.synthetic_world=flat"], ["data.synthetic_world", "no_signal", "per_horizon"]),
    (["trainer.precision=fp16"], ["trainer.precision", "fp32", "tf32", "bf16"]),
    (["trainer.epochs=abc"], ["trainer.epochs", "'abc'", "integer"]),
    (["experiment=cii"], ["did you mean experiment=ci?"]),
]


@pytest.mark.parametrize("overrides,expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_config_exits_2_naming_the_key(perception_home, overrides, expected):
    res = cli("perception-train", "experiment=ci", *overrides, home=perception_home)
    assert res.returncode == 2, res.stderr[-2000:]
    message = res.stderr.lower()
    for word in expected:
        assert word.lower() in message, f"{word!r} not in: {res.stderr[-1500:]}"
    assert "$VALUE" not in res.stderr, res.stderr[-1500:]  # the real value, never OmegaConf's placeholder
    assert not (perception_home / "runs").exists() or not any((perception_home / "runs").rglob("*.safetensors"))


TYPOS = [
    (["trainer.epoch=1"], "did you mean trainer.epochs?"),
    (["+trainer.epoch=1"], "did you mean trainer.epochs?"),  # Hydra's own hint; it would train 4 epochs
    (["-m", "trainer.epoch=1,2"], "did you mean trainer.epochs?"),
]


@pytest.mark.parametrize("overrides,hint", TYPOS, ids=[" ".join(c[0]) for c in TYPOS])
def test_a_typo_names_the_nearest_key_and_never_suggests_plus(perception_home, overrides, hint):
    res = cli("perception-train", "experiment=ci", *overrides, home=perception_home)
    assert res.returncode == 2, res.stderr[-2000:]
    assert hint in res.stderr, res.stderr[-1500:]
    assert "use +" not in res.stderr and "+trainer.epoch=1 " not in res.stderr, res.stderr[-1500:]
    assert not (perception_home / "runs").exists()


@pytest.mark.slow(seconds=85)
def test_resuming_into_the_other_variant_is_refused(perception_home):
    ok = cli("perception-train", "experiment=ci", "sweep_id=s1", "trainer.epochs=1", home=perception_home)
    assert ok.returncode == 0, ok.stderr[-3000:]
    src = perception_home / "runs" / "s1" / "shared-f0"
    dst = perception_home / "runs" / "s1" / "per_horizon-f0"
    shutil.copytree(src / "checkpoints", dst / "checkpoints")
    res = cli(
        "perception-train", "experiment=ci", "sweep_id=s1", "model.attention_pool=per_horizon", home=perception_home
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "shared checkpoint" in res.stderr and "trainer.init_from" in res.stderr
