"""`perception-sweep calibrate` as installed: A/A sweeps -> a noise file that records where and on what it
was measured, which the one-replicate gate then uses and names."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest


def cli(*args: str, env: dict, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"},
    )


@pytest.mark.slow(seconds=130)
@pytest.mark.timeout(1800)
def test_calibrate_writes_the_noise_file_the_gate_then_uses(perception_home, mlflow_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PERCEPTION_GATE_NOISE_DIR"}  # PERCEPTION_HOME's folder
    args = (
        "perception-sweep",
        "calibrate",
        "--experiment",
        "ci",
        "--sweeps",
        "1",
        "--cpu-workers",
        "2",
        "--arms",
        "shared",
        "trainer.epochs=1",
        "trainer.max_train_batches=2",
        f"tracking.uri={mlflow_server}",
    )
    # as the workflow runs it: the sweep in its own pod first (no file), then the file from the finished sweeps
    r = cli(*args, "--no-write", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "noise file: not written (--no-write)" in r.stdout and not (perception_home / "noise").exists()
    r = cli(*args, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr.count("finished earlier") == 6 and "building the feature cache" not in r.stderr
    path = perception_home / "noise" / "ci.json"  # under PERCEPTION_HOME, not in the installed package
    assert f"noise file: {path}" in r.stdout
    doc = json.loads(path.read_text())
    assert doc["match"]["experiment"] == "ci" and doc["match"]["trainer.epochs"] == "1"
    assert doc["match"]["trainer.max_train_batches"] == "2" and set(doc["arms"]) == {"shared"}
    assert doc["horizons"] == [2, 5, 10, 20, 40]
    for arm in ("shared",):
        cov = np.asarray(doc["arms"][arm]["cov"])
        assert doc["arms"][arm]["n_cells"] == 3 and cov.shape == (5, 5)  # one sweep x three folds
        assert np.all(np.linalg.eigvalsh(cov) > -1e-12) and np.trace(cov) > 0
    measured = doc["measured"]
    assert measured["host"] and measured["sweeps"] == ["calibrate-ci-shared-90000"] and measured["git_sha"]
    assert doc["source"].startswith("perception-sweep calibrate --experiment ci --sweeps 1")

    # a one-replicate sweep of the same experiment and scale: the gate adds this file's noise and names it
    r = cli(
        "perception-gate",
        "--sweep-id",
        "calibrate-ci-shared-90000",
        "--tracking-uri",
        mlflow_server,
        "--config",
        "ci",
        "--control",
        "shared",
        "--treatment",
        "shared_twin",
        "--out",
        str(tmp_path / "g"),
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "g" / "report.json").read_text())
    assert report["noise_file"] == str(path) and str(path) in report["training_noise"]
    assert {x["variance"] for x in report["rules"]} == {"windows + A/A file"}


def test_calibrate_rejects_bad_usage_before_any_work(perception_home):
    r = cli("perception-sweep", "calibrate", "--experiment", "ci", "--sweeps", "0", env=dict(os.environ))
    assert r.returncode == 2 and "--sweeps 0: expected 1 or more" in r.stderr
    r = cli("perception-sweep", "calibrate", "--experiment", "ci", "seed=3", env=dict(os.environ))
    assert r.returncode == 2 and "calibrate sets experiment" in r.stderr
    r = cli("perception-sweep", "calibrate", "--experiment", "ci", "--arms", "shared_skip", env=dict(os.environ))
    assert r.returncode == 2 and "'shared_skip' is not a seed arm" in r.stderr
    r = cli(
        "perception-sweep", "calibrate", "--experiment", "ci", "--out", "x.json", "--into-package", env=dict(os.environ)
    )
    assert r.returncode == 2 and "--into-package: not allowed with argument --out" in r.stderr
