"""Test helpers: the shared strict Argo validator, loaded from ../shared/argo."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_validator_module(shared_dir: Path) -> ModuleType:
    path = shared_dir / "argo" / "validate_workflow.py"
    spec = importlib.util.spec_from_file_location("validate_workflow", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_errors(shared_dir: Path, doc: dict) -> list[tuple[str, str]]:
    v = load_validator_module(shared_dir)
    return v.errors(v.make_validator("Workflow", strict=True), doc)
