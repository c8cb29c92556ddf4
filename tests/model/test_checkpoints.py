"""Checkpoints (DESIGN §6): V2 round trips, the V1 fixture, clear errors naming file and tensor,
warm start of the trunk, and atomic writes under a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from perception.errors import CheckpointError
from perception.model import AttentionPoolVariant, PerceptionModel
from perception.model.checkpoint import load_model, load_trunk, read_checkpoint_variant, save_model
from tests.model.helpers import HORIZONS, N_FEATURES, tiny_config
from tests.model.write_v1_fixture import FIXTURE, V1_DT_SCALE, write_v1

REPO = Path(__file__).resolve().parents[2]


def build(variant="shared", seed=0, d_model=16):
    return PerceptionModel(tiny_config(variant, d_model=d_model), N_FEATURES, HORIZONS, seed)


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("variant", ["shared", "per_horizon"])
def test_v2_round_trip(tmp_path, variant):
    model = build(variant, seed=1)
    model.set_dt_scale(0.25)
    path = tmp_path / "model.safetensors"
    save_model(path, model, {"epoch": "3"})
    with safe_open(str(path), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
    assert meta["format_version"] == "2"
    assert meta["attention_pool_variant"] == {"shared": "0", "per_horizon": "1"}[variant]
    assert ("pool.q_h" in names) == (variant == "per_horizon") and ("pool.q" in names) == (variant == "shared")
    assert read_checkpoint_variant(path) is AttentionPoolVariant(variant)

    fresh = build(variant, seed=2)
    assert load_model(path, fresh)["epoch"] == "3"
    assert_same_state(model, fresh)
    assert fresh.dt_scale.item() == 0.25


def test_v1_fixture_loads_as_shared(tmp_path):
    with safe_open(str(FIXTURE), framework="pt") as f:
        assert "format_version" not in (f.metadata() or {})
    assert read_checkpoint_variant(FIXTURE) is AttentionPoolVariant.shared
    model = build("shared", seed=5)
    load_model(FIXTURE, model)
    stored = load_file(str(FIXTURE))
    assert stored.keys() == model.state_dict().keys()
    for name, t in model.state_dict().items():
        assert torch.equal(t, stored[name]), name
    assert model.dt_scale.item() == V1_DT_SCALE
    write_v1(tmp_path / "again.safetensors")  # the writer still produces what the fixture holds
    assert read_checkpoint_variant(tmp_path / "again.safetensors") is AttentionPoolVariant.shared


def test_v1_into_per_horizon_is_an_error_naming_file_and_tensor():
    # the arms it can be loaded as, by name
    with pytest.raises(
        CheckpointError, match=rf"{FIXTURE.name}.*shared.*'q'.*per_horizon.*arm=shared or arm=shared_skip"
    ):
        load_model(FIXTURE, build("per_horizon"))


def test_wrong_variant_is_an_error_naming_file_and_tensor(tmp_path):
    path = tmp_path / "ph.safetensors"
    save_model(path, build("per_horizon"))
    with pytest.raises(CheckpointError, match=r"ph\.safetensors.*per_horizon.*'q_h'.*shared.*arm=per_horizon\)"):
        load_model(path, build("shared"))


def test_unknown_version_is_an_error(tmp_path):
    path = tmp_path / "v3.safetensors"
    save_file({k: v.contiguous() for k, v in build().state_dict().items()}, str(path), metadata={"format_version": "3"})
    for read in (lambda: read_checkpoint_variant(path), lambda: load_model(path, build())):
        with pytest.raises(CheckpointError, match=r"v3\.safetensors.*format_version '3'"):
            read()


def test_shape_mismatch_is_an_error_naming_file_and_tensor(tmp_path):
    path = tmp_path / "wide.safetensors"
    save_model(path, build(d_model=16))
    with pytest.raises(CheckpointError, match=r"wide\.safetensors: tensor 'vsn\.[a-z0-9_.]+' has shape"):
        load_model(path, build(d_model=8))
    with pytest.raises(CheckpointError, match=r"wide\.safetensors: tensor '.+' has shape"):
        load_trunk(path, build("per_horizon", d_model=8))


def test_missing_or_extra_tensor_is_an_error(tmp_path):
    tensors = {k: v.contiguous() for k, v in build().state_dict().items()}
    del tensors["cfc.w_rec"]
    save_file(tensors, str(tmp_path / "lacking.safetensors"))
    with pytest.raises(CheckpointError, match=r"lacking\.safetensors lacks tensor 'cfc\.w_rec'"):
        load_model(tmp_path / "lacking.safetensors", build())
    with pytest.raises(CheckpointError, match=r"lacks trunk tensor 'cfc\.w_rec'"):
        load_trunk(tmp_path / "lacking.safetensors", build())


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.001])
def test_truncated_file_is_an_error_naming_file_and_tensor(tmp_path, keep):
    path = tmp_path / "cut.safetensors"
    save_model(path, build())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"cut\.safetensors.*(tensor '.+'|ends inside its header)"):
        load_model(path, build())
    if keep > 0.1:  # the header is intact: the first cut-off tensor is named
        with pytest.raises(CheckpointError, match=r"truncated: tensor '.+'"):
            load_model(path, build())


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="nope.safetensors: no such file"):
        load_model(tmp_path / "nope.safetensors", build())


@pytest.mark.parametrize("source", ["v1", "v2_shared", "v2_per_horizon"])
@pytest.mark.parametrize("target", ["shared", "per_horizon"])
def test_warm_start_copies_only_the_trunk(tmp_path, source, target):
    if source == "v1":
        path = FIXTURE
    else:
        path = tmp_path / "donor.safetensors"
        save_model(path, build(source[3:], seed=21))
    donor_state = load_file(str(path))
    model, untouched = build(target, seed=3), build(target, seed=3)
    loaded = load_trunk(path, model)
    assert loaded and all(n.startswith(model.trunk_prefixes) for n in loaded)
    assert {n.split(".")[0] for n in loaded} == {"vsn", "mamba", "ln_b", "cfc"}
    state, fresh = model.state_dict(), untouched.state_dict()
    assert all(
        not torch.equal(donor_state[n], fresh[n])
        for n in loaded
        if n.endswith("weight") and "norm" not in n and "ln" not in n
    )
    for name in state:
        expected = donor_state[name] if name in loaded else fresh[name]
        assert torch.equal(state[name], expected), name


def test_metadata_must_be_strings_and_not_reserved(tmp_path):
    with pytest.raises(TypeError, match="'epoch': 3"):
        save_model(tmp_path / "m.safetensors", build(), {"epoch": 3})
    with pytest.raises(ValueError, match="format_version"):
        save_model(tmp_path / "m.safetensors", build(), {"format_version": "1"})
    assert not (tmp_path / "m.safetensors").exists()


KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import perception.model.checkpoint as ckpt
    from perception.model import PerceptionModel
    from tests.model.helpers import HORIZONS, N_FEATURES, tiny_config

    real_save_file = ckpt.save_file

    def torn_save_file(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        data = open(filename, "rb").read()
        open(filename, "wb").write(data[: len(data) // 2])  # half the bytes are on disk
        print("MID-SAVE", flush=True)
        time.sleep(600)

    ckpt.save_file = torn_save_file
    ckpt.save_model(sys.argv[1], PerceptionModel(tiny_config("shared"), N_FEATURES, HORIZONS, 99))
    """
)


def test_killed_writer_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "run" / "model.safetensors"
    model = build("shared", seed=4)
    save_model(path, model, {"epoch": "1"})
    before = path.read_bytes()

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        assert proc.stdout.readline().strip() == "MID-SAVE"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    strays = [p for p in path.parent.iterdir() if p != path]
    assert len(strays) == 1 and strays[0].name.endswith(".tmp")  # the kill did land mid-save
    with pytest.raises(CheckpointError):
        load_model(strays[0], build("shared"))
    assert path.read_bytes() == before
    restored = build("shared", seed=8)
    assert load_model(path, restored)["epoch"] == "1"
    assert_same_state(model, restored)
