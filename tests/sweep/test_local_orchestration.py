"""How the local sweep drives its steps: which runs start, with which overrides and GPU, what is
skipped on a re-run, and that the gate always runs. The trainer here is a recording stand-in
(the real one is exercised end to end in test_local_sweep.py)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid
from types import SimpleNamespace

import pytest

from perception.errors import ConfigError
from perception.sweep.local import run_local_sweep

FAKE_TRAIN = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    kv = dict(a.split("=", 1) for a in sys.argv[1:])
    name = f"{kv['arm']}-f{kv['data.fold']}" + (f"-r{kv['replicate']}" if kv["replicate"] != "0" else "")
    d = Path(os.environ["PERCEPTION_HOME"]) / "runs" / kv["sweep_id"] / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "last.safetensors").write_text("partial")
    t0 = time.time()
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "t0": t0, "t1": time.time(), "name": name}) + "\\n")
    fail = dict(x.split(":") for x in os.environ.get("FAKE_FAIL", "").split(",") if x)
    if name in fail:
        print("boom", name)
        sys.exit(int(fail[name]))
    (d / "done.json").write_text(json.dumps({"run_id": "run-" + name, "metrics": {"val_auc_mean": 0.6}}))
""")
FAKE_DATA = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps({"data": sys.argv[1:]}) + "\\n")
""")


@pytest.fixture
def fakes(tmp_path, perception_home, monkeypatch, mlflow_server):
    calls = tmp_path / "calls.jsonl"
    (tmp_path / "train.py").write_text(FAKE_TRAIN)
    (tmp_path / "data.py").write_text(FAKE_DATA)
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gate_calls: list[dict] = []

    def gate(sweep_id, **kw):
        gate_calls.append({"sweep_id": sweep_id, **kw})
        return SimpleNamespace(decision="keep_shared", refused=False, reasons=[], report_dir=tmp_path, exit_code=0)

    def read() -> list[dict]:
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    sweep_id = f"sweep-{uuid.uuid4().hex[:8]}"  # one tracking server serves every test

    def sweep(*overrides, gpus=(), sweep_id=sweep_id):
        lines: list[str] = []
        result = run_local_sweep(
            sweep_id,
            [*overrides, f"tracking.uri={mlflow_server}"],
            gpus=list(gpus),
            train_command=[sys.executable, str(tmp_path / "train.py")],
            data_command=[sys.executable, str(tmp_path / "data.py")],
            gate=gate,
            say=lines.append,
        )
        return result, lines

    return SimpleNamespace(sweep=sweep, calls=read, gate_calls=gate_calls, id=sweep_id, uri=mlflow_server)


def train_calls(calls):
    return [c for c in calls if "argv" in c]


def test_cpu_sweep_trains_six_runs_in_order_then_gates(fakes):
    result, lines = fakes.sweep("experiment=ci")
    calls = fakes.calls()
    assert calls[0] == {"data": ["build", "experiment=ci", f"tracking.uri={fakes.uri}"]}
    runs = train_calls(calls)
    assert [c["name"] for c in runs] == [
        "shared-f0",
        "per_horizon-f0",
        "shared-f1",
        "per_horizon-f1",
        "shared-f2",
        "per_horizon-f2",
    ]
    for c in runs:
        assert c["argv"][0] == "experiment=ci"
        assert f"sweep_id={fakes.id}" in c["argv"] and f"tracking.parent_run_id={result.parent_run_id}" in c["argv"]
        assert c["gpu"] is None
    for earlier, later in zip(runs, runs[1:]):
        assert earlier["t1"] <= later["t0"]  # sequential on CPU
    assert [r.status for r in result.runs] == ["finished"] * 6
    assert fakes.gate_calls == [
        {
            "sweep_id": fakes.id,
            "tracking_uri": fakes.uri,
            "experiment": "perception-ab",
            "config_name": "ci",
            "control": "shared",
            "treatment": "per_horizon",
        }
    ]
    assert result.exit_code == 0
    assert sum("finished in" in line for line in lines) == 6 and "[6/6]" in lines[-2]


def test_a_rerun_skips_finished_runs_and_retrains_only_the_failed_one(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "per_horizon-f1:1")
    first, lines = fakes.sweep("experiment=ci")
    assert [r.status for r in first.runs].count("failed") == 1
    assert len(fakes.gate_calls) == 1  # the gate runs anyway, to refuse with a reason
    assert first.exit_code == 1
    assert any("FAILED (exit 1)" in line for line in lines)

    monkeypatch.delenv("FAKE_FAIL")
    second, lines = fakes.sweep("experiment=ci")
    runs = train_calls(fakes.calls())
    assert [c["name"] for c in runs[6:]] == ["per_horizon-f1"]
    assert second.parent_run_id == first.parent_run_id
    assert sum("skipped" in line for line in lines) == 5
    assert any("per_horizon fold 1: resuming" in line for line in lines)
    assert second.exit_code == 0

    third, lines = fakes.sweep("experiment=ci")
    assert len(train_calls(fakes.calls())) == 7 and [r.status for r in third.runs] == ["skipped"] * 6
    assert sum("data" in c for c in fakes.calls()) == 2  # nothing left to train: no cache build either
    assert len(fakes.gate_calls) == 3


def test_gpus_train_one_run_each_in_parallel_with_their_own_logs(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "1.0")
    result, _ = fakes.sweep("experiment=ci", gpus=["3", "5"])
    runs = {c["name"]: c for c in train_calls(fakes.calls())}
    for fold in range(3):
        a, b = runs[f"shared-f{fold}"], runs[f"per_horizon-f{fold}"]
        assert (a["gpu"], b["gpu"]) == ("3", "5")
        assert a["t0"] < b["t1"] and b["t0"] < a["t1"]  # overlapping: side by side
    for r in result.runs:
        assert r.log is not None and r.log.parent.name == f"{r.spec.arm}-f{r.spec.fold}" and r.log.exists()


def test_overrides_the_sweep_sets_itself_are_refused_before_any_work(fakes):
    for bad in (
        "data.fold=1",
        "model.attention_pool=shared",
        "arm=shared_skip",
        "replicate=1",
        "sweep_id=x",
        "tracking.parent_run_id=abc",
    ):
        with pytest.raises(ConfigError, match="set by the sweep"):
            fakes.sweep(bad)
    with pytest.raises(ConfigError, match="trainer.epochs"):
        fakes.sweep("trainer.epochs=many")
    with pytest.raises(ConfigError, match="sweep_id 'a b'"):
        fakes.sweep(sweep_id="a b")
    assert fakes.calls() == [] and fakes.gate_calls == []


def test_a_config_error_in_training_stops_the_sweep(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "shared-f0:2")
    with pytest.raises(ConfigError, match="exit 2"):
        fakes.sweep("experiment=ci")
    assert len(train_calls(fakes.calls())) == 1 and fakes.gate_calls == []


def test_a_run_another_process_is_training_fails_alone_naming_it_and_the_sweep_goes_on(
    fakes, monkeypatch, perception_home
):
    from perception.locks import run_lock

    monkeypatch.setenv("FAKE_FAIL", "shared-f1:2")  # the trainer's exit on a run in use
    with run_lock(perception_home / "runs" / fakes.id / "shared-f1", fakes.id):  # held by this process
        result, lines = fakes.sweep("experiment=ci")
    assert [r.status for r in result.runs].count("failed") == 1 and result.exit_code == 1
    [failed] = [r for r in result.runs if r.status == "failed"]
    assert failed.note.startswith(f"trained by another process, pid {os.getpid()} on host ")
    assert any("shared fold 1: FAILED (exit 2)" in line and "trained by another process" in line for line in lines)
    assert len(train_calls(fakes.calls())) == 6 and len(fakes.gate_calls) == 1


def test_a_second_sweep_on_a_sweep_in_use_is_refused_before_any_work(fakes, perception_home):
    from perception.locks import LockHeld, sweep_lock

    with sweep_lock(perception_home / "runs" / fakes.id, fakes.id):
        with pytest.raises(LockHeld, match=f"sweep {fakes.id} is in use by pid {os.getpid()}"):
            fakes.sweep("experiment=ci")
    assert fakes.calls() == [] and fakes.gate_calls == []


def test_a_sweep_whose_experiment_chooses_no_gate_config_is_refused_before_any_work(fakes):
    with pytest.raises(ConfigError, match=r"experiment 'ci' chooses no gate config: add `- override /gate: NAME`"):
        fakes.sweep("experiment=ci", "~gate")
    assert fakes.calls() == [] and fakes.gate_calls == []


def test_the_gate_config_the_sweep_overrides_choose_is_the_one_it_decides_with(fakes):
    fakes.sweep("experiment=ci", "gate=default")
    assert [c["config_name"] for c in fakes.gate_calls] == ["default"]


def sequential_sweep(fakes, tmp_path, verdicts, arms=("shared", "per_horizon"), gpus=()):
    """A `--design sequential --max-replicates 3` sweep with a gate answering `verdicts` look by look
    (then keep_shared); each gate call records how many trainings had run and the look it was asked."""
    from perception.sweep.design import Design

    answers = iter(verdicts)

    def gate(sweep_id, **kw):
        look = len(fakes.gate_calls) + 1
        trained = len(train_calls(fakes.calls()))
        fakes.gate_calls.append({"look": look, "trained": trained, "asked": kw.get("look")})
        decision = next(answers, "keep_shared")
        summary = {
            "look": look,
            "max_looks": 3,
            "looks": [{"look": look, "W": 0.01, "G": 0.0, "p_W": 0.2, "p_G": 0.5, "efficacy_alpha": 0.013}],
            "why_stopped": "" if decision == "continue" else "efficacy boundary crossed",
        }
        return SimpleNamespace(
            decision=decision, refused=False, reasons=[], report_dir=tmp_path, exit_code=0, summary=summary
        )

    def run(sweep_id=fakes.id):
        lines: list[str] = []
        result = run_local_sweep(
            sweep_id,
            ["experiment=ci", f"tracking.uri={fakes.uri}"],
            gpus=list(gpus),
            train_command=[sys.executable, str(tmp_path / "train.py")],
            data_command=[sys.executable, str(tmp_path / "data.py")],
            gate=gate,
            say=lines.append,
            design=Design(arms=tuple(arms), replicates=3, kind="sequential"),
        )
        return result, lines

    return run


def test_a_sequential_sweep_trains_wave_by_wave_until_the_gate_stops_it(fakes, tmp_path):
    run = sequential_sweep(fakes, tmp_path, ["continue", "ship_per_horizon"])
    result, lines = run()
    assert [c["trained"] for c in fakes.gate_calls] == [6, 12]  # a look after each wave, no third wave
    assert [c["asked"] for c in fakes.gate_calls] == [1, 2]  # each look reads its own waves only
    names = [c["name"] for c in train_calls(fakes.calls())]
    assert names[:6] == ["shared-f0", "per_horizon-f0", "shared-f1", "per_horizon-f1", "shared-f2", "per_horizon-f2"]
    assert all(n.endswith("-r1") for n in names[6:]) and len(names) == 12
    assert result.gate.decision == "ship_per_horizon" and result.exit_code == 0
    looks = [line for line in lines if line.startswith("look ")]
    assert looks[0].startswith("look 1/3: W +0.0100") and looks[0].endswith("-> continue")
    assert "look 2/3" in looks[1] and "ship_per_horizon (efficacy boundary crossed)" in looks[1]
    assert "up to 18 runs" in lines[0] and "waves of 6" in lines[0]
    assert not any("idle" in line for line in lines)  # one training at a time: no lane is ever idle

    # a re-run finds both waves done: one gate call at the last complete look, nothing trained
    again, _ = run()
    assert len(train_calls(fakes.calls())) == 12 and len(fakes.gate_calls) == 3
    assert fakes.gate_calls[-1]["asked"] == 2
    assert [r.status for r in again.runs] == ["skipped"] * 12


THREE_ARMS = ("shared", "per_horizon", "shared_skip")
SIX_GPUS = [str(i) for i in range(6)]


def rounds_of(calls: list[dict]) -> list[list[tuple[str, str]]]:
    """The trainings grouped into the rounds they ran in (a round starts once the one before it has
    ended), each as (GPU, run name) in GPU order."""
    rounds: list[list[dict]] = []
    for c in sorted(calls, key=lambda c: c["t0"]):
        if rounds and c["t0"] < max(x["t1"] for x in rounds[-1]):
            rounds[-1].append(c)
        else:
            rounds.append([c])
    return [sorted((c["gpu"], c["name"]) for c in r) for r in rounds]


def fold_names(fold: int, replicate: int = 0) -> list[str]:
    return [f"{arm}-f{fold}" + (f"-r{replicate}" if replicate else "") for arm in THREE_ARMS]


def test_a_three_arm_wave_fills_its_last_rounds_idle_gpus_with_the_next_waves_trainings(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "1.0")
    run = sequential_sweep(fakes, tmp_path, ["continue", "ship_per_horizon"], arms=THREE_ARMS, gpus=SIX_GPUS)
    result, lines = run()
    rounds = rounds_of(train_calls(fakes.calls()))
    assert rounds == [
        list(zip(SIX_GPUS, fold_names(0) + fold_names(1))),
        list(zip(SIX_GPUS, fold_names(2) + fold_names(0, 1))),  # wave 1's last three, wave 2's first three
        list(zip(SIX_GPUS, fold_names(1, 1) + fold_names(2, 1))),  # the rest of wave 2: no third wave
    ]
    # look 1 after the second round, look 2 after the third, each asked for its own waves only
    assert [(c["asked"], c["trained"]) for c in fakes.gate_calls] == [(1, 12), (2, 18)]
    assert [r.spec.name for r in result.runs] == [n for r in rounds for _, n in r]  # each once, none skipped
    assert all(r.status == "finished" for r in result.runs) and result.exit_code == 0
    assert any(line.startswith("3 training(s) of replicate 1 start on the last round's idle lane(s)") for line in lines)
    assert not any("kept as finished runs" in line for line in lines)  # the study went on and used them


def test_a_study_stopping_at_the_look_keeps_the_trainings_that_ran_on_idle_gpus(
    fakes, tmp_path, monkeypatch, perception_home
):
    run = sequential_sweep(fakes, tmp_path, ["ship_per_horizon"], arms=THREE_ARMS, gpus=SIX_GPUS)
    result, lines = run()
    ahead = fold_names(0, 1)
    trained = sorted(c["name"] for c in train_calls(fakes.calls()))
    assert trained == sorted(fold_names(0) + fold_names(1) + fold_names(2) + ahead)  # wave 1 and three of wave 2
    assert [(c["asked"], c["trained"]) for c in fakes.gate_calls] == [(1, 12)]
    assert [r.status for r in result.runs if r.spec.replicate == 1] == ["finished"] * 3
    for name in ahead:
        assert (perception_home / "runs" / fakes.id / name / "done.json").exists()
    assert (
        "3 training(s) of replicate 1 ran on idle lanes before the study stopped at look 1: kept as finished "
        "runs, not read by its decision"
    ) in lines
    assert result.gate.decision == "ship_per_horizon" and result.exit_code == 0

    # a re-run with the same sweep id trains nothing and decides look 1 again from wave 1 alone
    again, lines = run()
    assert len(train_calls(fakes.calls())) == 12
    assert [c["asked"] for c in fakes.gate_calls] == [1, 1]
    assert [r.status for r in again.runs] == ["skipped"] * 9
    assert not any("kept as finished runs" in line for line in lines)
