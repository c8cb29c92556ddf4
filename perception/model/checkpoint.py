"""Model checkpoints (DESIGN §6): safetensors only, never pickle; written atomically.

V1: a SharedQuery state_dict with no `format_version` in the metadata.
V2: metadata `format_version` = "2" and `attention_pool_variant` ("0" shared, "1" per_horizon);
the per-horizon query is the tensor `q_h` [H, D] (the shared one is `q` [1, D])."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from perception.arms import arms_with_pool
from perception.atomic import atomic_path
from perception.errors import CheckpointError
from perception.model.config import AttentionPoolVariant

FORMAT_VERSION = "2"
VARIANT_CODES = {AttentionPoolVariant.shared: "0", AttentionPoolVariant.per_horizon: "1"}
RESERVED_KEYS = ("format_version", "attention_pool_variant")


def save_model(path: str | os.PathLike, model, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write a V2 checkpoint of `model` to `path` (temp file, fsync, rename)."""
    meta = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"checkpoint metadata must map str to str; got {key!r}: {value!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"checkpoint metadata key {key!r} is set by save_model itself")
        meta[key] = value
    meta["format_version"] = FORMAT_VERSION
    meta["attention_pool_variant"] = VARIANT_CODES[model.variant]
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str], AttentionPoolVariant]:
    """All tensors (on the CPU), the metadata and the variant of a V1 or V2 checkpoint."""
    return _open(Path(path), with_tensors=True)


def read_checkpoint_variant(path: str | os.PathLike) -> AttentionPoolVariant:
    """The variant a checkpoint holds, from its header alone; V1 (no format_version) reads as shared."""
    return _open(Path(path), with_tensors=False)[2]


def _open(path: Path, with_tensors: bool) -> tuple[dict[str, torch.Tensor], dict[str, str], AttentionPoolVariant]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()} if with_tensors else {}
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: not a readable safetensors file ({exc}){_truncation(path)}"
        ) from None
    return tensors, meta, _variant(path, meta)


def load_model(path: str | os.PathLike, model) -> dict[str, str]:
    """Load every tensor of `path` into `model` (same variant, same shapes); returns the metadata."""
    path = Path(path)
    tensors, meta, variant = read_checkpoint(path)
    if variant is not model.variant:
        query = "q_h" if variant is AttentionPoolVariant.per_horizon else "q"
        raise CheckpointError(
            f"checkpoint {path} holds a {variant.value} model (tensor {query!r}); the model being "
            f"loaded is {model.variant.value}: resume or load with an arm of a {variant.value} pool "
            f"(arm={' or arm='.join(arms_with_pool(variant))}), or warm-start the trunk with trainer.init_from"
        )
    expected = model.state_dict()
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks tensor {missing[0]!r} (missing: {missing})")
    unexpected = [n for n in tensors if n not in expected]
    if unexpected:
        raise CheckpointError(
            f"checkpoint {path} has tensor {unexpected[0]!r}, which the model does not (extra: {unexpected})"
        )
    _check_shapes(path, tensors, expected, list(expected))
    model.load_state_dict(tensors, strict=True)
    return meta


def load_trunk(path: str | os.PathLike, model) -> list[str]:
    """Warm start: copy the common trunk (VSN, Mamba2, LN_b, CfC) from a V1 or V2 checkpoint of either
    variant; everything else keeps its fresh initialisation. Returns the loaded tensor names."""
    path = Path(path)
    tensors, _, _ = read_checkpoint(path)
    expected = model.state_dict()
    names = [n for n in expected if n.startswith(tuple(model.trunk_prefixes))]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks trunk tensor {missing[0]!r} (missing: {missing})")
    _check_shapes(path, tensors, expected, names)
    with torch.no_grad():
        for name in names:
            expected[name].copy_(tensors[name])
    return names


def _variant(path: Path, meta: Mapping[str, str]) -> AttentionPoolVariant:
    version = meta.get("format_version")
    if version is None:
        return AttentionPoolVariant.shared  # V1 predates per-horizon queries
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: unknown format_version {version!r} (this version reads 2, or none for V1)"
        )
    code = meta.get("attention_pool_variant")
    for variant, c in VARIANT_CODES.items():
        if code == c:
            return variant
    raise CheckpointError(
        f"checkpoint {path}: metadata attention_pool_variant={code!r}; expected '0' (shared) or '1' (per_horizon)"
    )


def _truncation(path: Path) -> str:
    """Names the first tensor a truncated file cuts off, read from the safetensors header
    (8-byte little-endian length, then JSON with per-tensor data_offsets)."""
    try:
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        if len(raw) < 8 or len(raw) < 8 + n:
            return f"; the file ({len(raw)} bytes) ends inside its header"
        header = json.loads(raw[8 : 8 + n])
    except (OSError, ValueError):
        return ""
    have = len(raw) - 8 - n
    entries = [(v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__"]
    cut = sorted((end, name) for end, name in entries if end > have)
    if not cut:
        return ""
    return f"; truncated: tensor {cut[0][1]!r} needs data bytes up to {cut[0][0]}, the file holds {have}"


def _check_shapes(path: Path, tensors, expected, names) -> None:
    for name in names:
        got, want = tuple(tensors[name].shape), tuple(expected[name].shape)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path}: tensor {name!r} has shape {list(got)}, the model expects {list(want)} "
                "(a different model config?)"
            )
