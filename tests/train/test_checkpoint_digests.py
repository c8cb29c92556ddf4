"""A checkpoint's files are checked against the sha256 digests `latest.json` recorded when they were
written: weights overwritten in place (same size) are refused naming the file, never resumed from;
a pointer written before digests existed still resumes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from perception.errors import CheckpointError
from perception.train.state import CHECKPOINTS, LATEST, MODEL_FILE, STATE_FILE, latest_checkpoint, save_checkpoint
from tests.train.helpers import cli, final_predictions


def overwrite_in_place(path, offset_from_end: int = 64) -> bytes:
    """Flips bytes inside the tensor data (the file's tail), keeping its size; returns the original."""
    original = path.read_bytes()
    raw = bytearray(original)
    for i in range(len(raw) - offset_from_end, len(raw) - offset_from_end + 16):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert path.stat().st_size == len(original)
    return original


def small_checkpoint(run_dir):
    save = lambda p: save_file({"w": torch.arange(64, dtype=torch.float32)}, str(p))  # noqa: E731
    return save_checkpoint(run_dir, "epoch-0001", save, {"position": {"epoch": 1, "batch": 0}})


def test_digests_are_recorded_and_checked(tmp_path):
    target = small_checkpoint(tmp_path)
    pointer = json.loads((tmp_path / CHECKPOINTS / LATEST).read_text())
    assert pointer["dir"] == "epoch-0001" and set(pointer["sha256"]) == {MODEL_FILE, STATE_FILE}
    assert latest_checkpoint(tmp_path) == target

    for file in (MODEL_FILE, STATE_FILE):
        original = overwrite_in_place(target / file)
        with pytest.raises(CheckpointError) as err:
            latest_checkpoint(tmp_path)
        message = str(err.value)
        assert (
            message.startswith(f"{target / file}: sha256 ")
            and f"recorded in {tmp_path / CHECKPOINTS / LATEST}" in message
        )
        (target / file).write_bytes(original)
        assert latest_checkpoint(tmp_path) == target


def test_a_pointer_without_digests_still_resumes_and_a_malformed_one_is_refused(tmp_path):
    target = small_checkpoint(tmp_path)
    pointer = tmp_path / CHECKPOINTS / LATEST
    pointer.write_text(json.dumps({"dir": "epoch-0001"}))  # as written before digests existed
    assert latest_checkpoint(tmp_path) == target
    pointer.write_text(json.dumps({"dir": "epoch-0001", "sha256": {MODEL_FILE: "0" * 64}}))
    with pytest.raises(CheckpointError, match="sha256 must map model.safetensors and state.safetensors"):
        latest_checkpoint(tmp_path)


@pytest.mark.slow(seconds=85)  # three ci trainer starts, measured on the shared 2-core machine, busy
def test_the_trainer_refuses_weights_overwritten_in_place(perception_home):
    """End to end through `perception-train`: a run about to resume from its last
    checkpoint whose weights were overwritten (same size) exits 2 naming the file; restored, the same
    command resumes and ends with the predictions it had."""
    args = ["perception-train", "experiment=ci", "sweep_id=digests", "trainer.progress=false"]
    first = cli(*args, home=perception_home)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = perception_home / "runs" / "digests" / "shared-f0"
    before = final_predictions(run_dir)
    (run_dir / "done.json").unlink()  # as if killed after its last checkpoint: the next start resumes
    weights = run_dir / CHECKPOINTS / "epoch-0002" / MODEL_FILE
    original = overwrite_in_place(weights)

    refused = cli(*args, home=perception_home)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert f"{weights}: sha256 " in refused.stderr and "not resumed from" in refused.stderr
    assert "Traceback" not in refused.stderr and "resuming" not in refused.stdout
    assert not (run_dir / "done.json").exists()

    weights.write_bytes(original)
    resumed = cli(*args, home=perception_home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout and (run_dir / "done.json").exists()
    after = final_predictions(run_dir)
    assert all((before[k] == after[k]).all() for k in before)
