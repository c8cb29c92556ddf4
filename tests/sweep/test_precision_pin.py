"""A sweep keeps the precision it started with: the parent run records it, a continued sweep trains its
remaining runs at it with a note even where the default differs, and naming another one is refused
before anything is touched (the gate would refuse arms trained at different precisions)."""

from __future__ import annotations

import pytest

from perception.errors import ConfigError
from perception.sweep.precision_pin import PRECISION_TAG, pin_precision
from perception.tracking import client, parent_run_tags
from tests.sweep.test_local_orchestration import fakes, train_calls  # noqa: F401 (the fixture)


def test_pin_keeps_the_started_precision_and_refuses_another():
    assert pin_precision("s", None, "bf16", ["experiment=ci"]) == (["experiment=ci"], None)
    assert pin_precision("s", "tf32", "tf32", ["experiment=ci"]) == (["experiment=ci"], None)
    overrides, note = pin_precision("s", "tf32", "bf16", ["experiment=ci"])
    assert overrides == ["experiment=ci", "trainer.precision=tf32"]
    assert "started at trainer.precision=tf32" in note and "default bf16" in note
    with pytest.raises(ConfigError, match="sweep s was started at trainer.precision=tf32"):
        pin_precision("s", "tf32", "bf16", ["experiment=ci", "trainer.precision=bf16"])


def test_a_continued_sweep_trains_at_its_recorded_precision(fakes, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_FAIL", "per_horizon-f1:1")
    first, _ = fakes.sweep("experiment=ci")
    assert parent_run_tags(fakes.id, fakes.uri)[PRECISION_TAG] == "tf32"  # experiment=ci's default
    # stands for a sweep started before the default changed: its record differs from today's default
    mlflow = client(fakes.uri)
    mlflow.set_tag(first.parent_run_id, PRECISION_TAG, "bf16")
    monkeypatch.delenv("FAKE_FAIL")
    before = len(train_calls(fakes.calls()))
    second, lines = fakes.sweep("experiment=ci")
    retrained = train_calls(fakes.calls())[before:]
    assert [c["name"] for c in retrained] == ["per_horizon-f1"]
    assert "trainer.precision=bf16" in retrained[0]["argv"]
    assert any(f"sweep {fakes.id} was started at trainer.precision=bf16" in line for line in lines)

    status = mlflow.get_run(first.parent_run_id).info.status
    with pytest.raises(ConfigError, match="continue it at bf16 or start a new sweep id"):
        fakes.sweep("experiment=ci", "trainer.precision=tf32")
    assert mlflow.get_run(first.parent_run_id).info.status == status  # refused before the parent was touched
    assert len(train_calls(fakes.calls())) == before + 1
