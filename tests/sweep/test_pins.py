"""A sweep keeps the precision, the SSD (backend and chunk) and the VSN form it started with: the parent run
records them, a continued sweep trains its remaining runs with them with a note even where the defaults
differ, and naming another value is refused before anything is touched (the gate would refuse arms trained
at different values)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from perception.enums import enum_value
from perception.errors import ConfigError
from perception.sweep.pins import CHUNK_TAG, FOLD_TAG, FUSED_GRN_TAG, PRECISION_TAG, SSD_TAG, pin, started_values
from perception.sweep.prepare import prepare
from perception.train.compose import composed
from perception.tracking import client, parent_run_tags
from tests.sweep.test_local_orchestration import fakes, train_calls  # noqa: F401 (the fixture)


def test_pin_keeps_the_started_values_and_refuses_another():
    today = {PRECISION_TAG: "bf16", SSD_TAG: "mamba", FOLD_TAG: "true", CHUNK_TAG: "128", FUSED_GRN_TAG: "true"}
    new = started_values({})
    assert pin("s", new, today, ["experiment=ci"]) == (["experiment=ci"], [], today)
    assert pin("s", dict(today), today, ["experiment=ci"]) == (["experiment=ci"], [], today)
    started = {PRECISION_TAG: "tf32", SSD_TAG: "chunked", FOLD_TAG: "false", CHUNK_TAG: "64", FUSED_GRN_TAG: "false"}
    overrides, notes, pinned = pin("s", started, today, ["experiment=ci"])
    assert overrides == [
        "experiment=ci",
        "trainer.precision=tf32",
        "model.mamba.ssd=chunked",
        "model.vsn.fold_embed=false",
        "model.mamba.chunk=64",
        "model.vsn.fused_grn=false",
    ]
    assert pinned == started
    assert "started at trainer.precision=tf32" in notes[0] and "default bf16" in notes[0]
    assert "started at model.mamba.ssd=chunked: it continues at chunked, not at today's default mamba" in notes[1]
    assert "started at model.vsn.fold_embed=false: it continues at false, not at today's default true" in notes[2]
    assert "started at model.mamba.chunk=64: it continues at 64, not at today's default 128" in notes[3]
    assert "started at model.vsn.fused_grn=false: it continues at false, not at today's default true" in notes[4]
    with pytest.raises(ConfigError, match="sweep s was started at trainer.precision=tf32"):
        pin("s", {**today, PRECISION_TAG: "tf32"}, today, ["experiment=ci", "trainer.precision=bf16"])
    with pytest.raises(ConfigError, match="model.mamba.ssd=mamba: sweep s was started at model.mamba.ssd=chunked"):
        pin("s", {**today, SSD_TAG: "chunked"}, today, ["model.mamba.ssd=mamba"])
    refused = "model.vsn.fold_embed=true: sweep s was started at model.vsn.fold_embed=false"
    with pytest.raises(ConfigError, match=refused):
        pin("s", {**today, FOLD_TAG: "false"}, today, ["+model.vsn.fold_embed=true"])
    with pytest.raises(ConfigError, match="model.mamba.chunk=128: sweep s was started at model.mamba.chunk=64"):
        pin("s", {**today, CHUNK_TAG: "64"}, today, ["model.mamba.chunk=128"])


def test_a_parent_run_from_before_a_tag_trained_that_keys_only_form_then():
    """Every sweep started before the SSD's tag existed trained the chunked SSD, before the fold's tag the
    unfolded VSN and before the fused GRN's tag the unfused one, then the only production forms; a parent run
    without the precision tag pins nothing, as before, nor one without the chunk's (the experiment's own)."""
    before = {PRECISION_TAG: None, SSD_TAG: "chunked", FOLD_TAG: "false", CHUNK_TAG: None, FUSED_GRN_TAG: "false"}
    assert started_values({"sweep_id": "s"}) == before
    assert started_values({PRECISION_TAG: "tf32"}) == {**before, PRECISION_TAG: "tf32"}
    assert started_values({}) == dict.fromkeys(before)


def test_a_continued_sweep_trains_at_its_recorded_precision_and_ssd(fakes, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_FAIL", "per_horizon-f1:1")
    first, _ = fakes.sweep("experiment=ci")
    assert parent_run_tags(fakes.id, fakes.uri)[PRECISION_TAG] == "tf32"  # experiment=ci's default
    # stands for a sweep started before the default changed: its record differs from today's default
    assert parent_run_tags(fakes.id, fakes.uri)[SSD_TAG] == "chunked"
    assert parent_run_tags(fakes.id, fakes.uri)[FOLD_TAG] == "false"
    assert parent_run_tags(fakes.id, fakes.uri)[CHUNK_TAG] == "16"  # experiment=ci's
    assert parent_run_tags(fakes.id, fakes.uri)[FUSED_GRN_TAG] == "false"
    mlflow = client(fakes.uri)
    mlflow.set_tag(first.parent_run_id, PRECISION_TAG, "bf16")
    mlflow.set_tag(first.parent_run_id, SSD_TAG, "fla")
    mlflow.set_tag(first.parent_run_id, FOLD_TAG, "true")
    mlflow.set_tag(first.parent_run_id, CHUNK_TAG, "8")
    mlflow.set_tag(first.parent_run_id, FUSED_GRN_TAG, "true")
    monkeypatch.delenv("FAKE_FAIL")
    before = len(train_calls(fakes.calls()))
    second, lines = fakes.sweep("experiment=ci")
    retrained = train_calls(fakes.calls())[before:]
    assert [c["name"] for c in retrained] == ["per_horizon-f1"]
    assert "trainer.precision=bf16" in retrained[0]["argv"] and "model.mamba.ssd=fla" in retrained[0]["argv"]
    assert "model.vsn.fold_embed=true" in retrained[0]["argv"]
    assert "model.mamba.chunk=8" in retrained[0]["argv"] and "model.vsn.fused_grn=true" in retrained[0]["argv"]
    assert any(f"sweep {fakes.id} was started at trainer.precision=bf16" in line for line in lines)
    assert any(f"sweep {fakes.id} was started at model.mamba.ssd=fla" in line for line in lines)

    status = mlflow.get_run(first.parent_run_id).info.status
    with pytest.raises(ConfigError, match="continue it at bf16 or start a new sweep id"):
        fakes.sweep("experiment=ci", "trainer.precision=tf32")
    assert mlflow.get_run(first.parent_run_id).info.status == status  # refused before the parent was touched
    assert len(train_calls(fakes.calls())) == before + 1


def test_a_continued_workflow_sweep_trains_at_its_recorded_precision_and_ssd(
    perception_home, mlflow_server, tmp_path, capsys
):
    """The workflow's prepare step: it records the precision on a new sweep's parent run, outputs the one a
    continued sweep started with (every training pod appends it as trainer.precision) and refuses another."""
    no_data_build = [sys.executable, "-c", "pass"]  # the feature cache is not what is tested here
    sweep_id = f"wf-{uuid.uuid4().hex[:8]}"
    overrides = ["experiment=ci", f"tracking.uri={mlflow_server}"]
    default = str(enum_value(composed(overrides, checked=True).trainer.precision))
    other = "bf16" if default != "bf16" else "tf32"

    parent = prepare(sweep_id, overrides, data_command=no_data_build, outputs=tmp_path / "first")
    assert (tmp_path / "first" / "precision").read_text() == default
    assert (tmp_path / "first" / "ssd").read_text() == "chunked"  # experiment=ci's
    assert (tmp_path / "first" / "fold-embed").read_text() == "false"
    assert (tmp_path / "first" / "chunk").read_text() == "16"
    assert (tmp_path / "first" / "fused-grn").read_text() == "false"
    assert parent_run_tags(sweep_id, mlflow_server)[PRECISION_TAG] == default
    assert parent_run_tags(sweep_id, mlflow_server)[SSD_TAG] == "chunked"
    assert "was started at" not in capsys.readouterr().err

    # stands for a sweep started before the experiment's default changed
    client(mlflow_server).set_tag(parent, PRECISION_TAG, other)
    client(mlflow_server).set_tag(parent, SSD_TAG, "mamba")
    client(mlflow_server).set_tag(parent, FOLD_TAG, "true")
    client(mlflow_server).set_tag(parent, CHUNK_TAG, "32")
    assert prepare(sweep_id, overrides, data_command=no_data_build, outputs=tmp_path / "again") == parent
    assert (tmp_path / "again" / "precision").read_text() == other
    assert (tmp_path / "again" / "ssd").read_text() == "mamba"
    assert (tmp_path / "again" / "fold-embed").read_text() == "true"
    assert (tmp_path / "again" / "chunk").read_text() == "32"
    note = f"sweep {sweep_id} was started at trainer.precision={other}: it continues at {other}"
    assert note in capsys.readouterr().err  # the step's log
    assert parent_run_tags(sweep_id, mlflow_server)[PRECISION_TAG] == other  # the record is never rewritten

    # the step as its pod runs it, naming today's default explicitly: refused before the feature cache is built
    r = subprocess.run(
        [
            "perception-sweep",
            "prepare",
            "--sweep-id",
            sweep_id,
            "--outputs",
            str(tmp_path / "refused"),
            *overrides,
            f"trainer.precision={default}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"trainer.precision={default}: sweep {sweep_id} was started at trainer.precision={other}" in r.stderr
    assert f"continue it at {other} or start a new sweep id" in r.stderr
    assert not (tmp_path / "refused").exists() and not (perception_home / "cache").exists()
