"""`perception-train` works from a non-editable install: build a wheel, install it into a fresh
venv, run `perception-train experiment=ci` from an empty directory."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=50)
def test_wheel_in_fresh_venv_runs_ci(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (wheel,) = dist.glob("perception-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # Reuse this environment's heavy dependencies (torch, mlflow, ...) without their perception:
    # a plain path entry does not activate the editable install's finder.
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PERCEPTION_HOME": str(empty / "home"), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PYTHONPATH", None)
    where = subprocess.check_output(
        [str(py), "-c", "import perception.conf, perception; print(perception.__file__)"], cwd=empty, env=env, text=True
    ).strip()
    assert where.startswith(str(venv)), where
    res = subprocess.run(
        [str(venv / "bin" / "perception-train"), "experiment=ci", "trainer.epochs=1"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert list((empty / "home" / "runs").glob("*/shared-f0/done.json"))
    assert sorted(p.name for p in empty.iterdir()) == ["home"]  # nothing written outside PERCEPTION_HOME

    # the workflow definition ships in the wheel too: rendering needs no checkout
    rendered = subprocess.run(
        [str(venv / "bin" / "perception-sweep"), "render", "--out", str(tmp_path / "wf.yaml")],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    assert "nvidia.com/gpu" in (tmp_path / "wf.yaml").read_text()
