"""`perception-sweep` end to end with the real trainer, data builder, gate and an MLflow server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from perception.run_id import RunId
from tests.backends import both_backends

CI = ["experiment=ci", "trainer.epochs=1"]
REPO = Path(__file__).resolve().parents[2]
DECISION = re.compile(r"^decision: (ship_per_horizon|keep_shared|inconclusive)$", re.M)


def sweep_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["perception-sweep", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
    )
    return r


def git_head() -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip()


def assert_decided(r: subprocess.CompletedProcess, head_before: str) -> None:
    """A decision, unless the code itself changed since the sweep began (a commit in this checkout):
    then the gate must refuse on git_sha, as it should."""
    if git_head() != head_before:
        assert r.returncode == 1 and "git_sha" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        return
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert DECISION.search(r.stdout), r.stdout


def train_runs(uri: str, sweep_id: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("perception-ab")
    return c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = 'train'")


@pytest.mark.slow(seconds=290)
@both_backends(postgresql_seconds=450)
def test_local_sweep_decides_and_a_rerun_skips_finished_and_resumes_unfinished(perception_home, mlflow_server):
    sweep_id = f"e2e-{uuid.uuid4().hex[:8]}"
    args = ["local", "--sweep-id", sweep_id, *CI, f"tracking.uri={mlflow_server}"]
    head = git_head()
    r = sweep_cli(*args)
    assert_decided(r, head)
    report = Path(re.search(r"^report: (.+)$", r.stdout, re.M).group(1))
    assert report.is_dir() and any(report.iterdir())
    assert re.search(r"^wall time: [\d.]+ s", r.stdout, re.M)
    assert len(re.findall(r"^\[\d/6\] .*: finished in", r.stderr, re.M)) == 6
    # the terminal: the product's lines; MLflow's INFO lines in the sweep's and the runs' logs, no download bars
    assert "INFO mlflow" not in r.stderr + r.stdout and "Downloading artifacts" not in r.stderr, r.stderr[-3000:]
    assert (
        "Started monitoring system metrics"
        in (RunId(sweep_id, "shared", 0).directory(perception_home) / "train.log").read_text()
    )
    assert r.stdout.splitlines()[-1].startswith(
        f"next: perception-sweep ui --sweep-id {sweep_id} --tracking-uri {mlflow_server}"
    )
    # the report of a ci sweep opens with its first screen: the decision, the lift, the evidence, the next step
    screen = (report / "report.md").read_text().split("\n\n")[1].splitlines()
    assert 3 <= len(screen) <= 6, screen
    assert re.match(r"\*\*(Ship `per_horizon`|Keep `shared`|Inconclusive|Refused)\*\*: ", screen[0]), screen
    if not screen[0].startswith("**Refused"):  # a commit meanwhile: the gate refuses on git_sha (assert_decided)
        assert "W, the validation-AUC lift B − A (per_horizon − shared) at h40, averaged over 3 folds" in "\n".join(
            screen
        )
        assert re.search(r"AUC points, 95 % interval \[[-+]\d+\.\d, [-+]\d+\.\d\]", "\n".join(screen)), screen
    assert screen[-1].startswith("Next: "), screen

    runs = train_runs(mlflow_server, sweep_id)
    assert sorted((x.data.tags["variant"], x.data.tags["fold"]) for x in runs) == sorted(
        (v, f) for v in ("shared", "per_horizon") for f in "012"
    )
    parents = {x.data.tags.get("mlflow.parentRunId") for x in runs}
    assert len(parents) == 1 and None not in parents

    # A run killed after its last checkpoint but before it recorded completion.
    done = RunId(sweep_id, "per_horizon", 1).directory(perception_home) / "done.json"
    before = json.loads(done.read_text())["run_id"]
    done.unlink()
    r = sweep_cli(*args)
    assert_decided(r, head)  # since the first run: its runs carry that code version
    assert len(re.findall(r"finished earlier \(run \w+\), skipped", r.stderr)) == 5
    assert "per_horizon fold 1: resuming" in r.stderr
    assert json.loads(done.read_text())["run_id"] == before  # the same MLflow run, continued
    assert len(train_runs(mlflow_server, sweep_id)) == 6
    assert "decision: " in r.stdout

    r = sweep_cli("sync", "--sweep-id", sweep_id, "--tracking-uri", mlflow_server)
    assert r.returncode == 0 and "sent 0 pending" in r.stdout, r.stderr


@pytest.mark.slow(seconds=100)
def test_prepare_builds_the_cache_and_writes_the_parent_run_id(perception_home, mlflow_server, tmp_path):
    sweep_id = f"prep-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "parent-run-id"
    r = sweep_cli(
        "prepare", "--sweep-id", sweep_id, "--parent-run-id-file", str(out), *CI, f"tracking.uri={mlflow_server}"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    parent = out.read_text()
    assert r.stdout.strip().splitlines()[-1] == parent
    run = MlflowClient(mlflow_server).get_run(parent)
    assert run.data.tags["role"] == "sweep" and run.data.tags["sweep_id"] == sweep_id
    assert any((perception_home / "cache").iterdir())
    again = sweep_cli("prepare", "--sweep-id", sweep_id, *CI, f"tracking.uri={mlflow_server}")
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == parent  # found, not duplicated


@pytest.mark.parametrize(
    "bad, expected",
    [
        (["data.fold=1"], "data.fold is set by the sweep"),
        (["trainer.epochs=many"], "trainer.epochs"),
        (["model.attention_pool=bogus"], "model.attention_pool is set by the sweep"),
    ],
)
def test_bad_overrides_exit_2_before_any_work(perception_home, bad, expected):
    r = sweep_cli("local", *bad, timeout=120)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert not (perception_home / "runs").exists()


def test_sync_of_an_unknown_sweep_is_a_usage_error(perception_home):
    r = sweep_cli("sync", "--sweep-id", "nope", timeout=120)
    assert r.returncode == 2 and "nope" in r.stderr


@pytest.mark.slow(seconds=600)
def test_three_arm_sweep_trains_nine_runs_and_reports_the_attribution(perception_home, mlflow_server):
    sweep_id = "three-" + uuid.uuid4().hex[:8]
    head = git_head()
    r = sweep_cli(
        "local",
        "--sweep-id",
        sweep_id,
        "--arms",
        "shared,per_horizon,shared_skip",
        *CI,
        f"tracking.uri={mlflow_server}",
        timeout=1500,
    )
    assert_decided(r, head)
    runs = train_runs(mlflow_server, sweep_id)
    assert sorted((x.data.tags["variant"], x.data.tags["fold"]) for x in runs) == sorted(
        (a, str(f)) for a in ("shared", "per_horizon", "shared_skip") for f in range(3)
    )
    for x in runs:  # every run carries the learning-signal diagnostics
        for key in (
            "grad_norm_pool_query",
            "grad_norm_vsn",
            "grad_norm_mamba",
            "grad_norm_cfc",
            "grad_norm_heads",
            "query_divergence",
            "attention_entropy_ratio",
            "query_drift",
        ):
            assert key in x.data.metrics, (x.data.tags["variant"], key)
        assert x.data.params["arm"] == x.data.tags["variant"] and x.data.tags["replicate"] == "0"
        assert x.data.params["experiment"] == "ci"
    skip = [x for x in runs if x.data.tags["variant"] == "shared_skip"]
    assert all(x.data.params["model.shared_context_to_heads"] == "True" for x in skip)
    if git_head() == head:
        report = json.loads((perception_home / "gate" / sweep_id / "report.json").read_text())
        assert report["attribution"]["control"] == "shared_skip" and report["attribution"]["verdict"]
        assert report["context_path"]["treatment"] == "shared_skip"
        assert report["plan"]["arms"] == ["shared", "per_horizon", "shared_skip"] and not report["exploratory"]
        assert "## Attribution" in (perception_home / "gate" / sweep_id / "report.md").read_text()


@pytest.mark.slow(seconds=330)
def test_a_sequential_sweep_prints_each_look_and_runs_to_a_decision(perception_home, mlflow_server):
    sweep_id = f"seq-{uuid.uuid4().hex[:8]}"
    head = git_head()
    r = sweep_cli(
        "local",
        "--sweep-id",
        sweep_id,
        "--design",
        "sequential",
        "--max-replicates",
        "2",
        *CI,
        f"tracking.uri={mlflow_server}",
        timeout=900,
    )
    assert_decided(r, head)
    if git_head() != head:
        return
    looks = re.findall(r"^look (\d)/2: W [+-][\d.]+, G [+-][\d.]+, .* -> (\S+)", r.stderr, re.M)
    assert looks and looks[0][0] == "1", r.stderr[-3000:]
    assert [d for _, d in looks[:-1]] == ["continue"] * (len(looks) - 1) and looks[-1][1] != "continue"
    assert len(train_runs(mlflow_server, sweep_id)) == 6 * len(looks)  # a wave only after a look said continue
    c = MlflowClient(mlflow_server)
    exp = c.get_experiment_by_name("perception-ab")
    gates = c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = 'gate'")
    assert sorted(g.data.tags["look"] for g in gates) == [str(k) for k in range(1, len(looks) + 1)]
    parent = c.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.role = 'sweep'")[0]
    assert parent.data.tags["decision"] == looks[-1][1] and parent.info.status == "FINISHED"
    plan = json.loads(parent.data.tags["gate_plan"])
    assert plan["design"] == "sequential" and plan["max_replicates"] == 2


def test_each_design_refuses_the_other_designs_replicates_flag(perception_home):
    r = sweep_cli("local", "--design", "sequential", "--replicates", "2", "experiment=ci", timeout=120)
    assert r.returncode == 2 and "--design sequential takes --max-replicates" in r.stderr, r.stderr
    r = sweep_cli("local", "--max-replicates", "2", "experiment=ci", timeout=120)
    assert r.returncode == 2 and "--max-replicates 2 needs --design sequential" in r.stderr, r.stderr
    assert not (perception_home / "runs").exists()
