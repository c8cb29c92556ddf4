"""The documentation keeps its promises: `benchmarks/results/` and `studies/results/` are a record, not an
attic, and the code's design citations resolve inside the repository.

- Every file in benchmarks/results/ or studies/results/ is cited, by its path or its name, in README.md or a
  docs/*.md.
- Every results file README.md or docs/ cites exists: a `benchmarks/results/…` or `studies/results/…` path
  in the folder it names, or a bare file name of a results family (named after a benchmark or study script,
  or one of RESULT_FAMILIES) in either folder.
- Every relative link in README.md and docs/*.md points at a file of the repository.
- Every "DESIGN §N" anywhere in the tree names a section of docs/design.md; a quoted subsection after
  it ("DESIGN §6 \"Testing on 2 cores\"") must appear in that section.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_FOLDERS = ("benchmarks", "studies")
RESULTS = {folder: ROOT / folder / "results" for folder in SCRIPT_FOLDERS}
DESIGN = ROOT / "docs" / "design.md"
RESULT_EXTENSIONS = ("json", "jsonl", "md", "log", "png", "csv", "gz")
# Results not named after one script: the kernels' tables and CUDA test logs (benchmarks/gpu_check.sh),
# the CfC candidates, a run's diagnostics plot, the compiled trunk's pieces (benchmarks/trunk_forms.py conv,
# ssd, fusion).
RESULT_FAMILIES = ("ops", "cfc", "cuda_tests", "per_horizon_world", "mamba_conv", "mamba_ssd", "trunk_fusion")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "perception-home", "build", "dist"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cpp", ".cu", ".cuh", ".h", ".cfg", ".ini", ""}

NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\.(?:" + "|".join(RESULT_EXTENSIONS) + r")"
# A whole file name: not the tail of a longer name or glob (`ops_cfc.json` does not cite `cfc.json`).
BARE_NAME = re.compile(r"(?<![\w.*\-/])(" + NAME + r")(?![\w\-*]|\.\w)")
RESULTS_PATH = re.compile(r"\b(benchmarks|studies)/results/(" + NAME + r")(?![\w\-*]|\.\w)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITATION = re.compile(r"DESIGN\b[^\n]{0,3}§")
SECTION_NUMBER = re.compile(r"§\s*(\d+)(?:\s+\"([^\"]+)\")?")
HEADING = re.compile(r"^## (\d+)\. ", re.M)


def _docs() -> dict[Path, str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {f: f.read_text(encoding="utf-8") for f in files if f.is_file()}


def _results_files(folder: str | None = None) -> list[str]:
    """The results files' names, of one folder or of both."""
    folders = [RESULTS[folder]] if folder else RESULTS.values()
    return sorted(p.name for d in folders for p in d.iterdir() if p.is_file() and not p.name.startswith("."))


def _families() -> tuple[str, ...]:
    scripts = {p.stem for folder in SCRIPT_FOLDERS for p in (ROOT / folder).iterdir() if p.suffix in (".py", ".sh")}
    return tuple(sorted(scripts | set(RESULT_FAMILIES), key=len, reverse=True))


def _cited_results(text: str) -> set[tuple[str | None, str]]:
    """Results files a text cites, as (folder, name): by path (its folder), or bare names of a results family
    (folder None: either)."""
    cited = set(RESULTS_PATH.findall(text))
    families, pages = _families(), {p.name for p in (ROOT / "docs").glob("*.md")}
    for name in set(BARE_NAME.findall(text)) - pages:
        stem = name.rsplit(".", 1)[0]
        if any(stem == f or stem.startswith(f + "_") for f in families):
            cited.add((None, name))
    return cited


def test_every_results_file_is_cited_in_readme_or_docs():
    docs = _docs()
    everything = "\n".join(docs.values())
    cited_anywhere = set(BARE_NAME.findall(everything)) | {name for _, name in RESULTS_PATH.findall(everything)}
    uncited = [name for name in _results_files() if name not in cited_anywhere]
    assert not uncited, (
        f"benchmarks/results/ or studies/results/ hold files that neither README.md nor docs/*.md cite: {uncited}; "
        "cite each where its figure is used, or delete it (git keeps it)"
    )


def test_every_cited_results_file_exists():
    missing = {
        f"{path.relative_to(ROOT)}: {folder or 'benchmarks|studies'}/results/{name}"
        for path, text in _docs().items()
        for folder, name in _cited_results(text)
        if name not in _results_files(folder)
    }
    assert not missing, f"cited results files that their results folder does not hold: {sorted(missing)}"


def test_relative_links_resolve():
    broken = []
    for path, text in _docs().items():
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.\-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def _design_sections() -> dict[int, str]:
    text = DESIGN.read_text(encoding="utf-8")
    marks = list(HEADING.finditer(text))
    return {
        int(m.group(1)): text[m.start() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        for i, m in enumerate(marks)
    }


def _tree_text_files():
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for path in folder.iterdir():
            if path.is_dir():
                if (
                    path.name not in SKIP_DIRS
                    and not path.name.startswith(".")
                    and not path.name.endswith(".egg-info")
                    and path not in RESULTS.values()
                ):
                    stack.append(path)
            elif path.suffix in TEXT_SUFFIXES and path.is_file():
                try:
                    yield path, path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue


def test_design_sections_are_numbered_from_one():
    assert sorted(_design_sections()) == list(range(1, 10)), "docs/design.md must keep sections §1..§9"


def test_every_design_citation_names_a_section_of_docs_design():
    sections = _design_sections()
    wrong, seen = [], 0
    for path, text in _tree_text_files():
        for lineno, line in enumerate(text.splitlines(), 1):
            start = CITATION.search(line)
            if not start:
                continue
            for number, sub in SECTION_NUMBER.findall(line[start.end() - 1 :]):
                seen += 1
                where = f"{path.relative_to(ROOT)}:{lineno}"
                if int(number) not in sections:
                    wrong.append(f"{where}: §{number} is not a section of docs/design.md")
                elif sub and sub.lower() not in sections[int(number)].lower():
                    wrong.append(f"{where}: §{number} of docs/design.md does not contain {sub!r}")
    assert seen, "no DESIGN § citation found: the scan is not reading the tree"
    assert not wrong, "\n".join(wrong)
