"""The sequential design as an Argo Workflow: `-p design=sequential -p max-replicates=R` renders strictly valid,
and its recursive wave template is wired to the gate's output. The wiring is run, not read: the rendered
templates are unrolled as Argo's controller would (tests/sweep/argo_eval.py: substitution, expressions,
`when`), with a scripted gate deciding each look."""

from __future__ import annotations

import json
import subprocess
from typing import Callable, Optional

import pytest
import yaml

from perception.sweep import cli
from perception.sweep.design import Design
from perception.sweep.prepare import aheads, wave_fan_out
from perception.rounds import ahead_counts
from perception.sweep.render import render
from perception.sweep.schema import schema_errors

from .argo_eval import substitute, when

N_FOLDS = 3
PRECISION, SSD, FOLD, CHUNK, FUSED_GRN = "bf16", "mamba", "true", "128", "true"  # prepare's outputs: the sweep's values


def templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


def tasks_of(template: dict) -> dict[str, dict]:
    return {t["name"]: t for t in template["dag"]["tasks"]}


def arguments(task: dict, scope: dict) -> dict[str, str]:
    return {p["name"]: substitute(p["value"], scope) for p in task["arguments"]["parameters"]}


Run = tuple[str, str, str]  # (arm, fold, replicate)


def unroll(doc: dict, gate: Callable[[int], str], ahead: Optional[list[Run]] = None) -> tuple[list[Run], list]:
    """Runs the rendered workflow's control flow after prepare: the trainings (arm, fold, replicate) its waves
    start and the looks (look, decision) it takes, `gate(look)` deciding each ("refused" fails the look's
    step); `ahead` receives the next wave's trainings a wave starts on its idle GPUs."""
    tpl = templates(doc)
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    args = cli.parser().parse_args(prepare_args(doc))
    design = cli._design(args)  # prepare's own reading of its args
    wave_items = wave_fan_out("s", N_FOLDS, design)
    prepared = {
        "wave": json.dumps(wave_items),
        "aheads": json.dumps(aheads(wave_items, design, args.gpus)),
        "parent-run-id": "p1",
        "precision": PRECISION,
        "ssd": SSD,
        "fold-embed": FOLD,
        "chunk": CHUNK,
        "fused-grn": FUSED_GRN,
        "control": design.control,
        "treatment": design.treatment,
        "gate-config": "ci",
        "runs": "[]",
    }
    scope = {
        "workflow.name": "wf",
        **{f"workflow.parameters.{k}": v for k, v in params.items()},
        **{f"tasks.prepare.outputs.parameters.{k}": v for k, v in prepared.items()},
    }
    top = tasks_of(tpl[doc["spec"]["entrypoint"]])
    trained, looks = [], []
    if when(top["train"]["when"], scope):  # the fixed design: every replicate, one gate
        assert when(top["gate"]["when"], scope) and not when(top["waves"]["when"], scope)
        return trained, [(1, gate(1))]
    assert not when(top["gate"]["when"], scope) and when(top["waves"]["when"], scope)
    assert top["waves"]["depends"] == "prepare"
    task, caller = top["waves"], scope  # the task that calls a wave, and the scope its arguments see
    while task is not None:
        wave = tpl[task["template"]]
        inputs = arguments(task, caller)
        assert set(inputs) == {p["name"] for p in wave["inputs"]["parameters"]}
        local = {**scope, **{f"inputs.parameters.{k}": v for k, v in inputs.items()}}
        steps = tasks_of(wave)
        train = steps["train"]
        assert tpl[train["template"]]["container"]["command"] == ["perception-train"]
        for fan_out, started in ((train, trained), (steps["ahead"], ahead if ahead is not None else [])):
            assert fan_out["template"] == train["template"]
            for item in json.loads(substitute(fan_out["withParam"], local)):
                pod_in = arguments(fan_out, {**local, **{f"item.{k}": v for k, v in item.items()}})
                started.append((pod_in["arm"], pod_in["fold"], pod_in["replicate"]))
                pod = {"workflow.name": "wf", **{f"inputs.parameters.{k}": v for k, v in pod_in.items()}}
                pod_args = [substitute(a, {**scope, **pod}) for a in tpl[train["template"]]["container"]["args"]]
                assert f"trainer.precision={PRECISION}" in pod_args  # every wave at the sweep's precision
                assert f"model.mamba.ssd={SSD}" in pod_args  # and with its SSD
                assert f"model.vsn.fold_embed={FOLD}" in pod_args  # and its VSN form
                assert f"model.mamba.chunk={CHUNK}" in pod_args and f"model.vsn.fused_grn={FUSED_GRN}" in pod_args
        assert steps["ahead"]["continueOn"] == {"failed": True, "error": True}  # its own wave trains it again
        look = steps["look"]
        assert look["depends"] == "train.Succeeded || train.Failed || train.Errored"  # a failure makes it refuse
        number = int(arguments(look, local)["look"])
        gate_tpl = tpl[look["template"]]
        gate_args = gate_tpl["container"]["args"]
        assert gate_args[gate_args.index("--look") + 1] == "{{inputs.parameters.look}}"
        assert number <= 10, "the waves recurse without end"
        decided = gate(number)
        looks.append((number, decided))
        outputs = {p["name"]: p["valueFrom"]["path"] for p in gate_tpl["outputs"]["parameters"]}
        assert gate_args[gate_args.index("--decision-file") + 1] == outputs["decision"]
        nxt = steps["next"]
        assert nxt["template"] == task["template"]
        # the next wave starts once the look has decided and no ahead training still runs
        assert nxt["depends"] == "look.Succeeded && (ahead.Succeeded || ahead.Failed || ahead.Errored || ahead.Skipped)"
        local["tasks.look.outputs.parameters.decision"] = decided
        task, caller = (nxt if decided != "refused" and when(nxt["when"], local) else None), local
    return trained, looks


def prepare_args(doc: dict) -> list[str]:
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    scope = {"workflow.name": "wf", **{f"workflow.parameters.{k}": v for k, v in params.items()}}
    return [substitute(a, scope) for a in templates(doc)["prepare"]["container"]["args"]]


def sequential(max_replicates: int, smoke: bool = False, **extra: str) -> dict:
    return yaml.safe_load(
        render(smoke=smoke, params={"design": "sequential", "max-replicates": str(max_replicates), **extra})
    )


def scripted(*decisions: str) -> Callable[[int], str]:
    return lambda look: decisions[look - 1]


def wave(replicate: int, arms=("shared", "per_horizon")) -> list[tuple[str, str, str]]:
    return [(a, str(f), str(replicate)) for f in range(N_FOLDS) for a in arms]


@pytest.mark.parametrize("max_replicates", [2, 3])
@pytest.mark.parametrize("smoke", [False, True], ids=["study", "smoke"])
def test_the_sequential_render_validates_strictly(tmp_path, max_replicates, smoke):
    out = tmp_path / "wf.yaml"
    r = subprocess.run(
        [
            "perception-sweep",
            "render",
            "-p",
            "design=sequential",
            "-p",
            f"max-replicates={max_replicates}",
            "--out",
            str(out),
            *(["--smoke"] if smoke else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["perception-sweep", "validate", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Workflow OK" in r.stdout, r.stdout + r.stderr
    doc = yaml.safe_load(out.read_text())
    assert schema_errors(doc) == []
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert (params["design"], params["max-replicates"]) == ("sequential", str(max_replicates))
    # prepare pre-registers the sequential plan of that many looks
    assert cli._design(cli.parser().parse_args(prepare_args(doc))) == Design(
        kind="sequential", replicates=max_replicates
    )


@pytest.mark.parametrize(
    "decisions, waves",
    [
        (("continue", "continue", "keep_shared"), 3),  # to the last look
        (("continue", "ship_per_horizon"), 2),  # stops at look 2: wave 2 never trains
        (("keep_shared",), 1),  # futility at look 1
        (("continue", "refused"), 2),  # wave 1 lost a training: the look refuses, nothing more trains
    ],
)
def test_waves_recurse_while_the_gate_says_continue(decisions, waves):
    trained, looks = unroll(sequential(3), scripted(*decisions))
    assert looks == [(k + 1, d) for k, d in enumerate(decisions)]
    assert trained == [t for r in range(waves) for t in wave(r)]


def test_the_recursion_ends_at_max_replicates_whatever_the_gate_says():
    trained, looks = unroll(sequential(2), lambda look: "continue")
    assert [k for k, _ in looks] == [1, 2] and trained == wave(0) + wave(1)


def test_three_arms_and_the_aa_test_fan_out_per_wave_as_the_fixed_design_does():
    arms = ("shared", "per_horizon", "shared_skip")
    ahead: list[Run] = []
    trained, _ = unroll(sequential(3, arms=",".join(arms)), scripted("continue", "ship_per_horizon"), ahead)
    assert trained == wave(0, arms) + wave(1, arms)
    # 9 a wave on six GPUs: wave 0's second round trains 3 of wave 1 beside its last 3; wave 1 fills its
    # rounds (6 left), so it trains none of wave 2
    assert ahead == wave(1, arms)[:3]
    trained, _ = unroll(sequential(2, smoke=True, aa="true"), scripted("continue", "keep_shared"))
    assert trained == wave(0, ("shared", "shared_twin")) + wave(1, ("shared", "shared_twin"))


def test_the_fixed_design_takes_its_old_path():
    doc = yaml.safe_load(render(params={"replicates": "2"}))
    trained, looks = unroll(doc, scripted("ship_per_horizon"))
    assert looks == [(1, "ship_per_horizon")] and trained == []  # no wave: the fixed train task fans out
    assert cli._design(cli.parser().parse_args(prepare_args(doc))) == Design(replicates=2)


@pytest.mark.parametrize(
    "params, message",
    [
        (["-p", "design=sequential", "-p", "replicates=2"], "--design sequential takes --max-replicates"),
        (["-p", "max-replicates=2"], "--max-replicates 2 needs --design sequential"),
        (["-p", "design=sequential", "-p", "max-replicates=0"], "--max-replicates 0: expected 1 or more"),
        (["-p", "design=sequential", "-p", "max-replicates=two"], "-p max-replicates='two': expected a whole number"),
        (["-p", "design=sequentail"], "expected one of ['fixed', 'sequential']"),
    ],
)
def test_a_bad_sequential_design_is_refused_before_rendering(params, message):
    r = subprocess.run(["perception-sweep", "render", *params], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_the_design_flags_are_the_same_as_the_parameters():
    flags = subprocess.run(
        ["perception-sweep", "render", "--design", "sequential", "--max-replicates", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert flags.returncode == 0, flags.stderr
    assert yaml.safe_load(flags.stdout) == sequential(2)


@pytest.mark.parametrize("gpus, expected", [("6", [3, 0, 0]), ("4", [3, 2, 0]), ("9", [0, 0, 0]), ("1", [0, 0, 0])])
def test_the_idle_gpus_come_from_the_gpus_parameter(gpus, expected):
    arms = ("shared", "per_horizon", "shared_skip")
    ahead: list[Run] = []
    unroll(sequential(3, arms=",".join(arms), gpus=gpus), lambda look: "continue", ahead)
    counts = [sum(r == str(k + 1) for _, _, r in ahead) for k in range(3)]
    assert counts == expected and all(run in wave(int(run[2]), arms) for run in ahead)
    two_arms: list[Run] = []
    unroll(sequential(3, gpus=gpus), lambda look: "continue", two_arms)
    assert len(two_arms) == sum(ahead_counts(6, int(gpus), 3))
