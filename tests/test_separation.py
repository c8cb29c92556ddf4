"""Tests, benchmarks and studies stay apart: no test imports a benchmark or a study script (a test may run
one as a command), and no benchmark or study imports from tests/. What they share lives in the package
(perception.testing, perception.studies), where the layers' rules hold (tests/test_layout.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_FOLDERS = ("benchmarks", "studies")


def _scripts() -> set[str]:
    """Module names a script folder puts on the path: the folders and every script's stem in them."""
    return set(SCRIPT_FOLDERS) | {p.stem for folder in SCRIPT_FOLDERS for p in (ROOT / folder).glob("*.py")}


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _path_changes(node: ast.AST) -> str | None:
    """The source of a call that changes the import path or loads a module from a file, else None."""
    if not isinstance(node, ast.Call):
        return None
    func = ast.unparse(node.func)
    if func in ("sys.path.insert", "sys.path.append", "sys.path.extend", "site.addsitedir") or func.endswith(
        "spec_from_file_location"
    ):
        return ast.unparse(node)
    return None


def violations(path: Path, forbidden: set[str], folders: tuple[str, ...]) -> list[str]:
    """Imports in `path` whose top-level module is in `forbidden`, and import-path changes or file loads whose
    arguments name one of `folders`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        for module in _imported(node):
            if module.split(".")[0] in forbidden:
                found.append(
                    f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} imports {module}"
                )
        call = _path_changes(node)
        if call and any(f'"{f}"' in call or f"'{f}'" in call or f"/{f}" in call or f"{f}/" in call for f in folders):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} {call}")
    return found


def test_no_test_imports_a_benchmark_or_a_study_script():
    scripts = _scripts()
    wrong = [v for path in sorted((ROOT / "tests").rglob("*.py")) for v in violations(path, scripts, SCRIPT_FOLDERS)]
    assert not wrong, (
        "tests that import benchmark or study scripts (run them as commands, or test the package "
        "module they use):\n" + "\n".join(wrong)
    )


def test_no_benchmark_or_study_imports_from_tests():
    files = sorted(p for folder in SCRIPT_FOLDERS for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 10, "the scan does not see the scripts"
    wrong = [v for path in files for v in violations(path, {"tests", "conftest"}, ("tests",))]
    assert not wrong, (
        "benchmarks or studies that import from tests/ (move what they share into "
        "perception.testing):\n" + "\n".join(wrong)
    )


def test_the_scan_sees_every_way_in(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(
        "import benchmarks.gate as g\n"
        "def f():\n    from studies.validity import report\n    import gate_oc\n"
        "import importlib\nm = importlib.import_module('benchmarks.train_step')\n"
        "import sys\nsys.path.insert(0, str(ROOT / 'studies'))\n"
        "sys.path.append('/repo/benchmarks')\n"
        "from perception.studies import gate_oc as fine\n"
    )
    found = violations(f, _scripts(), SCRIPT_FOLDERS)
    assert sorted(v.split(" ", 1)[1] for v in found) == sorted(
        [
            "imports benchmarks.gate",
            "imports studies.validity",
            "imports gate_oc",
            "imports benchmarks.train_step",
            "sys.path.insert(0, str(ROOT / 'studies'))",
            "sys.path.append('/repo/benchmarks')",
        ]
    )
    g = tmp_path / "b.py"
    g.write_text(
        "import sys\nsys.path.insert(0, str(REPO / 'tests'))\nfrom tests.gate import x\n"
        "from perception.testing.sweep_store import SweepSpec\n"
    )
    assert sorted(v.split(" ", 1)[1] for v in violations(g, {"tests", "conftest"}, ("tests",))) == [
        "imports tests.gate",
        "sys.path.insert(0, str(REPO / 'tests'))",
    ]
