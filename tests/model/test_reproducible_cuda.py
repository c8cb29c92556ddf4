"""The compiled trunk trains to the same bits in fresh processes (benchmarks/determinism.py): two processes
per setting, each with its own Inductor and Triton caches, train a few steps from one seed and batch, and
every parameter is compared bitwise (sha256 over all of them), at tf32 and bf16 on both CfC paths, and at
experiment=production's setting (bf16, mamba_ssm's SSD at chunk 128, the folded VSN and the fused GRN)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = "bf16+compiled+mamba+folded+fusedgrn+chunk128"  # experiment=production's form


@pytest.mark.cuda
@pytest.mark.parametrize("cfc_path", ["auto", "portable"])
def test_fresh_processes_train_the_compiled_trunk_to_identical_parameters(cfc_path, tmp_path):
    out = tmp_path / "determinism.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "determinism.py"),
            "--settings",
            "tf32+compiled",
            "bf16+compiled",
            PRODUCTION,
            "--processes",
            "2",
            "--steps",
            "2",
            "--batch",
            "4",
            "--cfc-path",
            cfc_path,
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    result = json.loads(out.read_text())
    settings = ("tf32+compiled", "bf16+compiled", PRODUCTION)
    assert {s: len(h) for s, h in result["hashes"].items()} == dict.fromkeys(settings, 2)
    assert all(len(h) == 64 for found in result["hashes"].values() for h in found)  # sha256 hex digests
    assert result["reproducible"] == dict.fromkeys(settings, True), result["first_step_gradient_differences"]


def test_a_misspelt_setting_is_refused_by_name_before_any_process_trains(tmp_path):
    """A switch the script does not know would otherwise train another form under the setting's name."""
    out = tmp_path / "determinism.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "determinism.py"),
            "--settings",
            "bf16+compiled+chunk128",
            "bf16+compiled+fusedgrnn",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--settings bf16+compiled+fusedgrnn" in done.stderr and "unknown parts ['fusedgrnn']" in done.stderr
    assert not out.exists()
