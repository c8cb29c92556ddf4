"""One rule for identities, everywhere: every command that takes a sweep id refuses one off the rule
(exit 2, naming the value and the rule) having written nothing, and no place derived from an id, a
Hydra override or a file in a run directory lies outside PERCEPTION_HOME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from perception.errors import CheckpointError, ConfigError
from perception.paths import sweep_dir
from perception.run_id import RunId
from perception.train.state import latest_checkpoint

RULE = "expected letters, digits, '.', '_' or '-', at most 63 characters"
LONG = "x" * 300
BAD_IDS = ["../../x", "..", "a b", "a'b", LONG]


def run(*args: str, cwd: Path, home: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """An installed command, run in `cwd` with PERCEPTION_HOME=`home` (not made beforehand)."""
    full = {**os.environ, "PERCEPTION_HOME": str(home), **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)
    exe = shutil.which(args[0])
    assert exe, f"{args[0]} is not installed on PATH"
    return subprocess.run([exe, *args[1:]], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def assert_refused(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for word in words:
        assert word in r.stderr, f"{word!r} not in: {r.stderr[-2000:]}"


@pytest.mark.parametrize("sweep_id", BAD_IDS, ids=["dotdot-path", "dotdot", "space", "quote", "300-chars"])
def test_perception_train_refuses_a_bad_sweep_id_having_written_nothing(tmp_path, sweep_id):
    work = tmp_path / "work"
    work.mkdir()
    value = f'"{sweep_id}"' if "'" in sweep_id else sweep_id  # Hydra's quoting: the value is a'b
    r = run("perception-train", "experiment=ci", f"sweep_id={value}", cwd=work, home=work / "h")
    shown = repr(sweep_id) if len(sweep_id) < 70 else f"{sweep_id[:60]!r}… (300 characters)"
    assert_refused(r, f"sweep_id {shown}", RULE, "no path separators")
    assert r.stderr.count("\n") == 1, r.stderr  # one line, not four tracebacks
    assert written(tmp_path) == ["work"]


def test_a_multirun_with_one_bad_sweep_id_starts_no_job(tmp_path):
    r = run("perception-train", "-m", "experiment=ci", "sweep_id=fine,../escape", cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "sweep_id '../escape'", RULE)
    r = run("perception-train", "-m", "experiment=ci", "sweep_id=glob(*)", cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "sweep_id=glob(*): expected sweep ids, listed")
    assert written(tmp_path) == []


@pytest.mark.parametrize(
    "override",
    [
        "hydra.run.dir={out}",
        "hydra.sweep.dir={out}",
        "hydra.output_subdir=../../../../o",
        "hydra.sweep.subdir=../../../../o",
    ],
)
def test_hydra_s_output_directory_stays_under_perception_home(tmp_path, override):
    home = tmp_path / "h"
    multirun = ["-m"] if "sweep" in override else []
    r = run(
        "perception-train",
        *multirun,
        "experiment=ci",
        override.format(out=tmp_path / "outside"),
        cwd=tmp_path,
        home=home,
    )
    assert_refused(r, override.split("=")[0], f"outside {home}")
    assert written(tmp_path) == []


def test_a_hydra_directory_under_home_is_accepted_and_a_refused_start_leaves_no_run_directory(tmp_path):
    """The places pass (the error is the next check's), and the config refusal comes before any run
    directory, or Hydra's, is made."""
    home = tmp_path / "h"
    r = run(
        "perception-train",
        "experiment=ci",
        "sweep_id=s1",
        f"hydra.run.dir={home}/hydra-here",
        "trainer.epochs=-1",
        cwd=tmp_path,
        home=home,
    )
    assert_refused(r, "trainer.epochs=-1: expected a positive integer")
    assert written(tmp_path) == []


@pytest.mark.parametrize(
    "command",
    [
        ["perception-sweep", "local", "--cpu-workers", "2", "--sweep-id", "s1"],
        ["perception-sweep", "prepare", "--sweep-id", "s1"],
    ],
    ids=["local", "prepare"],
)
def test_a_sweep_refuses_a_bad_value_before_building_or_training_anything(tmp_path, command):
    r = run(*command, "experiment=ci", "trainer.epochs=-1", cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "trainer.epochs=-1: expected a positive integer")
    assert written(tmp_path) == []


def test_a_config_refused_inside_the_run_leaves_no_run_directory(tmp_path):
    """`arm=…` is applied where the run's place is derived (after Hydra starts); its refusal must not
    leave runs/<sweep>/ behind either."""
    home = tmp_path / "h"
    r = run("perception-train", "experiment=ci", "sweep_id=s1", "replicate=-1", cwd=tmp_path, home=home)
    assert_refused(r, "replicate=-1")
    assert not (home / "runs").exists(), written(home)


def test_a_checkpoint_pointer_leading_out_of_the_run_is_refused(tmp_path):
    home = tmp_path / "h"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"not read")
    (outside / "state.safetensors").write_bytes(b"not read")
    pointer = home / "runs" / "s1" / "shared-f0" / "checkpoints" / "latest.json"
    pointer.parent.mkdir(parents=True)
    pointer.write_text(json.dumps({"dir": "../../../../elsewhere"}))
    r = run("perception-train", "experiment=ci", "sweep_id=s1", cwd=tmp_path, home=home)
    assert_refused(r, "cannot resume", "../../../../elsewhere", "expected a checkpoint directory inside")
    assert written(outside) == ["model.safetensors", "state.safetensors"]
    for name in ({"dir": 7}, {"dir": "/abs/path"}, {"dir": "epoch-0001/.."}):
        pointer.write_text(json.dumps(name))
        with pytest.raises(CheckpointError, match="latest.json points to"):
            latest_checkpoint(pointer.parent.parent)


@pytest.mark.parametrize(
    "command",
    [
        ["perception-sweep", "local", "experiment=ci", "--sweep-id"],
        ["perception-sweep", "prepare", "experiment=ci", "--sweep-id"],
        ["perception-sweep", "render", "--sweep-id"],
        ["perception-sweep", "submit", "--host", "https://127.0.0.1:9", "--sweep-id"],
        ["perception-sweep", "ui", "--sweep-id"],
        ["perception-sweep", "sync", "--sweep-id"],
        ["perception-gate", "--sweep-id"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
@pytest.mark.parametrize("sweep_id", ["../../x", LONG], ids=["path", "300-chars"])
def test_every_command_taking_a_sweep_id_refuses_one_off_the_rule(tmp_path, command, sweep_id):
    r = run(*command, sweep_id, cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "argument --sweep-id", RULE, sweep_id[:60])
    assert written(tmp_path) == []


def test_the_workflow_parameter_sweep_id_is_checked_before_render_writes(tmp_path):
    out = tmp_path / "wf.yaml"
    r = run("perception-sweep", "render", "-p", "sweep-id=../x", "--out", str(out), cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "-p sweep-id=../x", RULE)
    assert written(tmp_path) == []


@pytest.mark.parametrize(
    "command", [["perception-sweep", "local", "experiment=ci"], ["perception-sweep", "render"]], ids=["local", "render"]
)
def test_replicates_below_one_are_refused(tmp_path, command):
    r = run(*command, "--replicates", "0", cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "--replicates 0: expected 1 or more")
    assert written(tmp_path) == []


def test_ui_refuses_a_latest_sweep_whose_tag_breaks_the_rule(tmp_path):
    """The id `ui` reads from the tracking store goes into an MLflow filter: it is checked like a typed one."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("perception-ab")
    client.create_run(exp, tags={"role": "sweep", "sweep_id": "x' OR tags.role = 'gate"})
    r = run("perception-sweep", "ui", "--tracking-uri", uri, cwd=tmp_path, home=tmp_path / "h")
    assert_refused(r, "tag sweep_id of the latest sweep's run", "\"x' OR tags.role = 'gate\"", RULE)


def test_places_derived_from_an_id_stay_under_their_root(tmp_path):
    home = tmp_path / "h"
    (home / "runs").mkdir(parents=True)
    assert RunId("s1", "shared", 0).directory(home) == home / "runs" / "s1" / "shared-f0"
    (home / "runs" / "linked").symlink_to(tmp_path, target_is_directory=True)  # a sweep's folder leading out
    with pytest.raises(ConfigError, match=r"sweep_id 'linked': .* outside .*/h/runs"):
        sweep_dir("linked", home)
    disk = tmp_path / "big-disk"
    disk.mkdir()
    (home / "runs" / "linked").unlink()
    (home / "runs").rmdir()
    (home / "runs").symlink_to(disk, target_is_directory=True)  # the runs root itself on another disk: fine
    assert RunId("s1", "shared", 0, 2).directory(home) == home / "runs" / "s1" / "shared-f0-r2"


def test_a_run_id_names_its_run_everywhere_as_runs_were_always_named():
    """Replicate 0 keeps the names runs had before replicates existed; the tags and the workflow's
    items carry every part as a string, as MLflow and Argo hold them."""
    first, third = RunId("s1", "shared", 1), RunId("s1", "per_horizon", 0, 2)
    assert (first.name, third.name) == ("shared-f1", "per_horizon-f0-r2")
    assert (first.label, third.label) == ("shared fold 1", "per_horizon fold 0 replicate 2")
    assert third.key == ("per_horizon", 0, 2)
    assert third.tags() == {
        "sweep_id": "s1",
        "variant": "per_horizon",
        "fold": "0",
        "replicate": "2",
        "role": "train",
    }
    assert third.fan_out_item() == {"arm": "per_horizon", "fold": "0", "replicate": "2"}
    assert third.wave_item() == {"arm": "per_horizon", "fold": "0"}
    assert third.overrides() == ["arm=per_horizon", "data.fold=0", "replicate=2"]


def test_a_run_id_with_a_bad_sweep_id_has_no_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep_id '\.\./x'"):
        RunId("../x", "shared", 0).directory(tmp_path)


def test_a_ledger_entry_cannot_upload_a_file_outside_its_run(tmp_path, perception_home):
    from perception.tracking import RunLedger

    secret = tmp_path / "secret.txt"
    secret.write_text("not for the tracking server")
    d = RunId("s1", "shared", 0).directory(perception_home)
    ledger = RunLedger(d, f"sqlite:///{perception_home / 'mlflow.db'}")
    ledger.record("start", tags={"sweep_id": "s1", "role": "train"}, params={}, run_name="shared-f0")
    ledger.record("artifact", path="../../../../secret.txt", artifact_path="logs")
    assert not ledger.flush(force=True)
    assert "tracking.jsonl #1: artifact path '../../../../secret.txt' lies outside the run" in ledger.failures()[-1]
    assert [e["op"] for e in ledger.unsent()] == ["artifact"]


def test_sync_leaves_a_run_directory_linked_out_of_its_sweep_alone(tmp_path):
    """`perception-sweep sync` reads each run directory's ledger: one that is a link leading out of the
    sweep's folder is named and not read (nor locked, nor written)."""
    home = tmp_path / "h"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tracking.jsonl").write_text('{"id": 0, "op": "start", "tags": {}, "params": {}, "time_ms": 0}\n')
    (home / "runs" / "s1").mkdir(parents=True)
    (home / "runs" / "s1" / "shared-f0").symlink_to(outside, target_is_directory=True)
    r = run(
        "perception-sweep",
        "sync",
        "--sweep-id",
        "s1",
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'm.db'}",
        cwd=tmp_path,
        home=home,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"shared-f0: resolves to {outside}, outside {home / 'runs' / 's1'}; left alone" in r.stderr
    assert written(outside) == ["tracking.jsonl"]
