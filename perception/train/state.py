"""Training state beside the weights: optimizer, scheduler, RNG and loader position, as safetensors
plus JSON metadata (never pickle). A checkpoint is a directory made complete before `latest.json`
points to it, so a kill at any moment leaves the previous checkpoint usable. `latest.json` also holds
the sha256 of each of the checkpoint's files, checked before a resume: a file changed after it was
written (overwritten in place, same size) is refused, never resumed from. A pointer written before the
digests existed (`{"dir": ...}` alone) still resumes, unchecked."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from perception.atomic import atomic_path, atomic_write_text
from perception.errors import CheckpointError

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"


@dataclass
class Position:
    epoch: int  # the next epoch to run
    batch: int = 0  # batches of that epoch already done


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.exists():
        return None
    try:
        content = json.loads(pointer.read_text())
        name = content["dir"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{pointer}: unreadable checkpoint pointer ({exc})") from exc
    path = run_dir / CHECKPOINTS / str(name)
    if not isinstance(name, str) or path.resolve().parent != (run_dir / CHECKPOINTS).resolve():
        raise CheckpointError(
            f"{pointer} points to {name!r}, which resolves to {path.resolve()}: expected a "
            f"checkpoint directory inside {run_dir / CHECKPOINTS}"
        )
    if not (path / MODEL_FILE).exists() or not (path / STATE_FILE).exists():
        raise CheckpointError(f"{pointer} points to {path}, which lacks {MODEL_FILE} or {STATE_FILE}")
    if "sha256" in content:
        _verify(pointer, path, content["sha256"])
    return path


def _verify(pointer: Path, checkpoint: Path, recorded: Any) -> None:
    if not isinstance(recorded, dict) or set(recorded) != {MODEL_FILE, STATE_FILE}:
        raise CheckpointError(
            f"{pointer}: sha256 must map {MODEL_FILE} and {STATE_FILE} to their digests; got {recorded!r}"
        )
    for file, want in sorted(recorded.items()):
        got = file_sha256(checkpoint / file)
        if got != want:
            raise CheckpointError(
                f"{checkpoint / file}: sha256 {got} differs from {want}, recorded in {pointer} when it was "
                f"written: the file changed since (overwritten or corrupted), so it is not resumed from; "
                f"restore it, or delete {checkpoint.parent} to train this run from its start"
            )


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_checkpoint(run_dir: Path, name: str, save_model_fn, state: dict[str, Any]) -> Path:
    """Writes `checkpoints/<name>/` (weights via `save_model_fn(path)`, then state), then points
    `latest.json` at it and removes older checkpoints."""
    root = run_dir / CHECKPOINTS
    target = root / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    save_model_fn(target / MODEL_FILE)
    tensors: dict[str, torch.Tensor] = {}
    meta = _flatten(state, "s", tensors)
    with atomic_path(target / STATE_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"state": json.dumps(meta)})
    digests = {file: file_sha256(target / file) for file in (MODEL_FILE, STATE_FILE)}
    atomic_write_text(root / LATEST, json.dumps({"dir": name, "sha256": digests}))
    for old in root.iterdir():
        if old.is_dir() and old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return target


def load_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / STATE_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["state"])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"{path}: unreadable training state ({type(exc).__name__}: {exc})") from exc
    return _unflatten(meta, tensors)


def _flatten(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):  # keys may be ints (optimizer state): keep their types
        return {"__dict__": [[k, _flatten(v, f"{key}.{i}", tensors)] for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return {"__list__": [_flatten(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]}
    return obj


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: _unflatten(v, tensors) for k, v in obj["__dict__"]}
        if "__list__" in obj:
            return [_unflatten(v, tensors) for v in obj["__list__"]]
    return obj
