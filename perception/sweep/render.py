"""The Argo Workflow of the A/B, built from its one hera definition in workflows/ab_sweep.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Mapping, Optional

from perception.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def workflow_file() -> Path:
    """PERCEPTION_WORKFLOW_FILE, else the installed copy (perception.workflows), else the checkout's."""
    candidates = [Path(p) for p in [os.environ.get("PERCEPTION_WORKFLOW_FILE")] if p]
    candidates += [_installed_copy(), REPO / "workflows" / "ab_sweep.py", Path.cwd() / "workflows" / "ab_sweep.py"]
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(
        "workflows/ab_sweep.py not found (looked at "
        + ", ".join(str(c) for c in candidates)
        + "); run from a clone of the repository or set PERCEPTION_WORKFLOW_FILE"
    )


def _installed_copy() -> Path:
    spec = importlib.util.find_spec("perception.workflows")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) / "ab_sweep.py" if locations else REPO / "workflows" / "ab_sweep.py"


def load_definition(path: Optional[Path] = None) -> ModuleType:
    path = path or workflow_file()
    spec = importlib.util.spec_from_file_location("perception_ab_sweep_workflow", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(smoke: bool = False, params: Optional[Mapping[str, str]] = None):
    """The hera Workflow, with workflow parameters overridden by `params`: checked by name and enum,
    then as the pods will use them (perception.sweep.validate), so a mistake fails here."""
    from perception.sweep.validate import check_parameters

    definition = load_definition()
    w = definition.build_workflow(smoke=smoke)
    defaults = {p.name: p.value for p in w.arguments}
    set_parameters(w, params or {})
    check_parameters(defaults, {p.name: p.value for p in w.arguments}, definition.shared_overrides())
    return w


def set_parameters(w, params: Mapping[str, str]) -> None:
    by_name = {p.name: p for p in w.arguments}
    for name, value in params.items():
        if name not in by_name:
            raise ConfigError(f"workflow parameter {name!r} does not exist; expected one of {sorted(by_name)}")
        p = by_name[name]
        if p.enum and value not in p.enum:
            raise ConfigError(f"workflow parameter {name}={value!r}: expected one of {p.enum}")
        p.value = value


def render(smoke: bool = False, params: Optional[Mapping[str, str]] = None) -> str:
    return build(smoke, params).to_yaml()


def parameters_markdown(smoke: bool = False) -> str:
    """The workflow's parameters as README lists them: name, default (the smoke variant's where it
    differs), allowed values, meaning; from the definition itself, so the list cannot fall behind."""
    definition = load_definition()
    study = definition.build_workflow(smoke=False).arguments
    smoke_values = {p.name: p.value for p in definition.build_workflow(smoke=True).arguments}
    lines = ["| parameter | default | meaning |", "|---|---|---|"]
    for p in study:
        default = f"`{p.value}`" if p.value else "(empty)"
        if smoke_values[p.name] != p.value:
            default += f" (smoke: `{smoke_values[p.name]}`)"
        allowed = f" One of {', '.join(f'`{v}`' for v in p.enum)}." if p.enum else ""
        lines.append(f"| `{p.name}` | {default} | {p.description}.{allowed} |")
    return "\n".join(lines) + "\n"
