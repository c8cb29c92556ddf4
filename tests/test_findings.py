"""Comments, docstrings and config comments say what a thing is and why; what was measured lives in docs/
(docs/performance.md, docs/validity.md, docs/kernels.md), where it can be kept current in one place.

A comment or docstring in perception/ or conf/ fails this check when it quotes a time in milliseconds
("83.3 ms") or carries measurement prose: a paragraph opening "Measured", or "measured" followed by a
figure in the same clause ("measured 0.96-0.98"). A pointer to where the figures live is what belongs there.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (ROOT / "perception", ROOT / "conf")
C_SUFFIXES = {".cu", ".cuh", ".cpp", ".h"}
MILLISECONDS = re.compile(r"\d ?ms\b")
MEASURED = re.compile(r"\bMeasured\b|\bmeasured\b[^.;:]{0,60}?\d")


def python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def yaml_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment: a # at the line's start or after a space, outside quotes."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", lambda m: " " * len(m.group()), line)
        start = re.search(r"(^|\s)#", unquoted)
        if start:
            found.append((lineno, line[start.end() :]))
    return found


def c_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every // and /* */ comment."""
    return [(text.count("\n", 0, m.start()) + 1, m.group()) for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S)]


def prose(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_prose(text)
    if path.suffix in (".yaml", ".yml"):
        return yaml_prose(text)
    if path.suffix in C_SUFFIXES:
        return c_prose(text)
    return []


def findings(path: Path) -> list[str]:
    wrong = []
    for lineno, text in sorted(prose(path)):
        flat = " ".join(text.split())
        for rule, pattern in (("a time in ms", MILLISECONDS), ("measurement prose", MEASURED)):
            hit = pattern.search(flat)
            if hit:
                wrong.append(
                    f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{lineno}: "
                    f"{rule}: {flat[max(0, hit.start() - 30) : hit.end() + 30]!r}"
                )
    return wrong


def test_no_measurements_in_the_code_s_comments_or_the_config_s():
    files = [
        p
        for folder in SCANNED
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.suffix in {".py", ".yaml", ".yml"} | C_SUFFIXES)
    ]
    assert len(files) > 50, "the scan is not reading the tree"
    wrong = [w for path in files for w in findings(path)]
    assert not wrong, (
        "measurements belong in docs/ (docs/performance.md, docs/validity.md, docs/kernels.md), "
        "with a pointer from the code:\n" + "\n".join(wrong)
    )


def test_the_check_catches_each_kind_and_leaves_code_alone(tmp_path):
    py = tmp_path / "m.py"
    py.write_text(
        '"""A module.\n\nMeasured (some.json): no lift."""\n'
        "timeout_ms = 5  # a plain why\n"
        'def f():\n    """Fast: 18.1 ms on a GPU."""\n    return \'3 ms\'\n'
        "x = 1  # the gradient was measured 0 in fp32\n"
    )
    hits = findings(py)
    assert [h.split(": ")[1] for h in hits] == ["measurement prose", "a time in ms", "measurement prose"], hits
    assert [h.split(":")[1] for h in hits] == ["1", "6", "8"], hits
    yaml = tmp_path / "c.yaml"
    yaml.write_text("a: 1  # 83.3 ms a step\nb: '# 5 ms, quoted'\n# measured fastest at K = 6000\nc: 2  # why\n")
    assert [h.split(":")[1] for h in findings(yaml)] == ["1", "3"], findings(yaml)
    cu = tmp_path / "k.cu"
    cu.write_text('int a = 1; // 0.171 ms\n/* a why,\n   not a figure */\nconst char* s = "2 ms";\n')
    assert [h.split(":")[1] for h in findings(cu)] == ["1"], findings(cu)
