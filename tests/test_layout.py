"""The package's layers: data -> model (over ops) -> train -> sweep / gate -> studies / testing, with nothing
importing back up. Top-level modules (paths, tracking, arms, errors, ...) are shared ground every layer may use.
`testing` (sweeps logged as trainings log them, real servers) and `studies` (the statistical studies' pure
code) sit on top: the product never imports them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perception"
LAYERS = ("data", "ops", "model", "train", "gate", "sweep", "testing", "studies")
# What each layer may import besides itself and the top-level modules.
ALLOWED = {
    "base": set(),
    "data": set(),
    "ops": set(),
    "model": {"ops"},
    "train": {"data", "ops", "model"},
    "gate": set(),  # reads runs from MLflow only: no torch, no model
    "sweep": {"data", "ops", "model", "train", "gate"},
    "testing": {"sweep"},  # the MLflow server starts and stops as `perception-sweep ui` does
    "studies": {"gate", "sweep", "testing"},
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "base"


def imports(path: Path) -> set[str]:
    """Every perception.* module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perception"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "perception")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("perception"))
    return found


def test_no_import_runs_back_up_the_layers():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("perception", *path.relative_to(PACKAGE).with_suffix("").parts))
        mine = layer_of(module)
        for target in imports(path):
            theirs = layer_of(target)
            if theirs not in (mine, "base") and theirs not in ALLOWED[mine]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} ({mine}) imports {target} ({theirs})")
            if mine == "base" and theirs != "base":
                wrong.append(f"{path.relative_to(PACKAGE.parent)} (top level) imports {target} ({theirs})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_check_sees_function_level_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from perception.train.compose import composed\n")
    assert "perception.train.compose" in imports(f)
    assert layer_of("perception.train.compose") == "train" and layer_of("perception.paths") == "base"
    assert layer_of("perception.data") == "data"


def test_every_directory_that_ships_is_a_listed_package():
    """A new layer, config group or data directory must be added to pyproject's `packages`: setuptools
    warns about an unlisted one today and will leave it out of the wheel. Tracked files only (a build's
    untracked outputs, such as ops/lib, are not part of the source)."""
    import subprocess
    import tomllib

    root = PACKAGE.parent
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    found = set()
    for name, where in setuptools["package-dir"].items():
        for f in tracked:
            parts = Path(f).parts
            if parts[0] == where and len(parts) > 1:
                found.add(".".join([name, *parts[1:-1]]))
    assert {"perception.conf.model", "perception.gate.noise"} <= found  # the check sees data directories
    assert found - set(setuptools["packages"]) == set(), "directories that ship but are not in pyproject's packages"
