"""`perception-sweep submit --wait`, `status`, `logs` and `stop` against a local Argo server
(tests/sweep/fake_argo.py), run as the installed command; and the node-tree reading they share."""

from __future__ import annotations

import os
import subprocess

import pytest
from hera.workflows.models import Workflow

from perception.sweep import follow
from perception.sweep.logs import fnv32a, pod_name, pods_by_step

from . import fake_argo
from .fake_argo import TOKEN


@pytest.fixture
def argo():
    fake = fake_argo.serve()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def sweep(*args: str, token: str | None = TOKEN, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
    if token is not None:
        env["ARGO_TOKEN"] = token
    return subprocess.run(["perception-sweep", *args], env=env, capture_output=True, text=True, timeout=timeout)


def server_args(argo) -> list[str]:
    return ["--host", argo.url, "--namespace", "perception", "--secure=false"]  # the fake speaks plain http


# ---- submit --wait ---------------------------------------------------------------------------


def test_wait_follows_a_sweep_to_its_decision(argo):
    r = sweep("submit", *server_args(argo), "--smoke", "--wait", "--poll-interval", "0.05")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    name = "ab-sweep-smoke-x0k2p"
    assert f"submitted {name}" in out
    for label in ("prepare", "shared-f0", "per_horizon-f2", "gate"):
        assert f"{label}: Running" in out
    assert "shared-f0: retry 1 after: imminent node shutdown" in out
    assert out.count("shared-f0: Succeeded") == 1  # one line per change, not per poll
    assert f"{name}: Succeeded" in out
    assert "decision: ship_per_horizon" in out
    assert f"argo: {argo.url}/workflows/perception/{name}" in out
    assert f"mlflow: tags.sweep_id = '{name}'" in out


@pytest.mark.parametrize("kind, code, decision", [("refused", 3, "decision: refused"), ("fails", 1, "decision: none")])
def test_wait_exit_code_says_how_the_sweep_ended(argo, kind, code, decision):
    argo.next_script = kind
    r = sweep("submit", *server_args(argo), "--smoke", "--wait", "--poll-interval", "0.05")
    assert r.returncode == code, r.stdout + r.stderr
    assert decision in r.stdout
    assert ": Failed" in r.stdout


def test_wait_gives_up_after_the_timeout_with_124(argo):
    argo.next_script = "never_ends"
    r = sweep("submit", *server_args(argo), "--smoke", "--wait", "--poll-interval", "0.1", "--timeout", "1")
    assert r.returncode == 124, r.stdout + r.stderr
    assert "timed out after 1 s" in r.stdout and "is Running" in r.stdout
    assert "perception-sweep status ab-sweep-smoke-x0k2p" in r.stdout


@pytest.mark.parametrize("flag, value", [("--poll-interval", "0"), ("--timeout", "-5")])
def test_bad_wait_options_are_usage_errors_before_posting(argo, flag, value):
    r = sweep("submit", *server_args(argo), "--smoke", "--wait", flag, value)
    assert r.returncode == 2 and "--poll-interval" in r.stderr
    assert argo.requests == []


def test_wait_prints_each_look_of_a_sequential_study_and_its_final_decision(argo):
    argo.next_script = "sequential"
    r = sweep("submit", *server_args(argo), "--smoke", "-p", "design=sequential", "--wait", "--poll-interval", "0.05")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln[:2].isdigit()]  # without the clock
    first, second = "look 1/3: continue (W +0.0123, G +0.0031)", "look 2/3: ship_per_horizon (W +0.0311, G +0.0102)"
    assert lines.count(first) == 1 and lines.count(second) == 1  # once each, as it comes
    # look 1, then wave 1 trains, then look 2
    assert (
        lines.index("look-1: Succeeded")
        < lines.index(first)
        < lines.index("shared-f0-r1: Running")
        < lines.index("look-2: Running")
        < lines.index(second)
    )
    assert "decision: ship_per_horizon" in r.stdout and "decision: continue" not in r.stdout


def test_a_study_stopped_between_looks_has_no_decision(argo):
    argo.next_script = "sequential_stopped"
    r = sweep("submit", *server_args(argo), "--smoke", "-p", "design=sequential", "--wait", "--poll-interval", "0.05")
    assert r.returncode == 1, r.stdout + r.stderr  # look 1's `continue` is no decision
    assert "look 1/3: continue (W +0.0123, G +0.0031)" in r.stdout and "decision: none" in r.stdout


# ---- status ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "at, code, looks, decision",
    [
        (2, 0, ["look 1/3: continue (W +0.0123, G +0.0031)"], "not yet"),  # wave 1 training
        (
            4,
            0,
            ["look 1/3: continue (W +0.0123, G +0.0031)", "look 2/3: ship_per_horizon (W +0.0311, G +0.0102)"],
            "ship_per_horizon",
        ),
    ],
)
def test_status_lists_a_sequential_studys_looks(argo, at, code, looks, decision):
    argo.add("ab-sweep-seq", "sequential")
    argo.workflows["ab-sweep-seq"]["i"] = at
    r = sweep("status", "ab-sweep-seq", *server_args(argo))
    assert r.returncode == code, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("look ")] == looks
    assert f"decision: {decision}" in lines
    assert any(ln.split() == ["look-1", "Succeeded"] for ln in lines)  # the look's step, named by its look


@pytest.mark.parametrize(
    "kind, code, decision",
    [
        ("succeeds", 0, "ship_per_horizon"),
        ("refused", 3, "refused"),
        ("fails", 1, "none"),
        ("never_ends", 0, "not yet"),
    ],
)
def test_status_shows_each_step_and_exits_with_the_decision(argo, kind, code, decision):
    argo.add("ab-sweep-abcde", kind, at_end=True)
    r = sweep("status", "ab-sweep-abcde", *server_args(argo))
    assert r.returncode == code, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ab-sweep-abcde: ") and "progress" in lines[0]
    assert f"decision: {decision}" in lines
    assert "mlflow: tags.sweep_id = 'ab-sweep-abcde'" in lines
    if kind == "succeeds":
        [shared_f0] = [ln for ln in lines if ln.strip().startswith("shared-f0 ")]
        assert "Succeeded" in shared_f0 and "retries 1" in shared_f0 and "imminent node shutdown" in shared_f0


def test_status_of_an_unknown_workflow_is_a_usage_error(argo):
    r = sweep("status", "ab-sweep-nope", *server_args(argo))
    assert r.returncode == 2 and "'ab-sweep-nope'" in r.stderr and "namespace 'perception'" in r.stderr


def test_status_with_a_wrong_token_fails_naming_the_token(argo):
    argo.add("ab-sweep-abcde", "succeeds")
    r = sweep("status", "ab-sweep-abcde", *server_args(argo), token="wrong")
    assert r.returncode == 1 and "401" in r.stderr and "ARGO_TOKEN" in r.stderr


def test_the_sweep_id_comes_from_the_parameter_then_the_label():
    wf = Workflow(
        metadata={"name": "ab-sweep-x", "labels": {"perception/sweep-id": "from-label"}},
        spec={"arguments": {"parameters": [{"name": "sweep-id", "value": "{{workflow.name}}"}]}},
    )
    assert follow.sweep_id_of(wf) == "from-label"
    wf.spec.arguments.parameters[0].value = "my-sweep"
    assert follow.sweep_id_of(wf) == "my-sweep"
    assert follow.sweep_id_of(Workflow(metadata={"name": "ab-sweep-y"}, spec={})) == "ab-sweep-y"


def test_a_fanned_out_training_is_named_by_its_inputs_and_a_new_workflow_is_pending():
    wf = Workflow(
        metadata={"name": "w"},
        spec={},
        status={
            "nodes": {
                "w-1": {
                    "id": "w-1",
                    "name": "w.train(0:{...})",
                    "displayName": 'train(0:{"arm":"shared_skip"})',
                    "type": "Pod",
                    "templateName": "train",
                    "phase": "Running",
                    "inputs": {
                        "parameters": [
                            {"name": "arm", "value": "shared_skip"},
                            {"name": "fold", "value": "2"},
                            {"name": "replicate", "value": "1"},
                        ]
                    },
                }
            }
        },
    )
    s = follow.snapshot(wf)
    assert [st.label for st in s.steps] == ["shared_skip-f2-r1"] and s.decision is None
    assert follow.snapshot(Workflow(metadata={"name": "w"}, spec={})).phase == "Pending"


def test_wait_outlasts_an_unreachable_server_and_stops_on_a_bad_token():
    from perception.sweep.argo_api import ArgoError

    done = Workflow(
        **{
            "metadata": {"name": "w"},
            "spec": {},
            "status": fake_argo.status("w", "Succeeded", [fake_argo.gate("Succeeded", "keep_shared")]),
        }
    )
    answers = [ArgoError("connection refused", transient=True), ArgoError("HTTP 503", 503, transient=True), done]

    def get():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    lines: list[str] = []
    waited = follow.wait(get, 5.0, None, lines.append, sleep=lambda s: None)
    assert not waited.timed_out and follow.outcome(waited.last) == follow.EXIT_DECIDED
    assert sum("server unreachable" in ln for ln in lines) == 1 and "server reachable again" in lines[1]
    with pytest.raises(ArgoError):
        follow.wait(
            lambda: (_ for _ in ()).throw(ArgoError("HTTP 401", 401)), 5.0, None, lines.append, sleep=lambda s: None
        )


# ---- logs ------------------------------------------------------------------------------------


def test_logs_prints_every_pod_labelled_by_its_step(argo):
    argo.add("ab-sweep-abcde", "succeeds", at_end=True)
    r = sweep("logs", "ab-sweep-abcde", *server_args(argo))
    assert r.returncode == 0, r.stderr
    assert "prepare: hello from prepare(0) line 0" in r.stdout
    assert "shared-f0(0): hello from train-shared-f0(0) line 1" in r.stdout  # the preempted attempt
    assert "shared-f0(1): hello from train-shared-f0(1) line 0" in r.stdout
    assert "gate: hello from gate(0) line 1" in r.stdout
    [req] = [q for q in argo.requests if q["path"].split("?")[0].endswith("/log")]
    assert req["query"] == {"logOptions.container": "main"}


def test_logs_of_one_task_ask_for_its_pods_and_follow_the_latest(argo):
    argo.add("ab-sweep-abcde", "succeeds", at_end=True)
    r = sweep("logs", "ab-sweep-abcde", "--task", "shared-f0", "-f", *server_args(argo))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"shared-f0({a}): hello from train-shared-f0({a}) line {i}" for a in (0, 1) for i in (0, 1)
    ]
    reqs = [q["query"] for q in argo.requests if q["path"].split("?")[0].endswith("/log")]
    assert [q.get("logOptions.follow") for q in reqs] == [None, "true"]
    assert all(q["podName"].startswith("ab-sweep-abcde-train-") for q in reqs)


def test_logs_of_one_look_pick_its_wave(argo):
    """Every wave's gate step is named `look`; `--task look-2` is the second look, `--task look` all of them."""
    argo.add("ab-sweep-seqlg", "sequential", at_end=True)
    r = sweep("logs", "ab-sweep-seqlg", "--task", "look-2", *server_args(argo))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(ln.startswith("look-2: ") for ln in lines), r.stdout
    r = sweep("logs", "ab-sweep-seqlg", "--task", "look", *server_args(argo))
    assert r.returncode == 0, r.stderr
    assert {ln.split(":")[0] for ln in r.stdout.splitlines()} == {"look-1", "look-2"}


def test_logs_of_an_unknown_task_name_the_known_ones(argo):
    argo.add("ab-sweep-abcde", "succeeds", at_end=True)
    r = sweep("logs", "ab-sweep-abcde", "--task", "shared-f9", *server_args(argo))
    assert r.returncode == 2 and "--task 'shared-f9'" in r.stderr and "shared-f0" in r.stderr


def test_pod_names_follow_argos_v2_format():
    assert fnv32a("hello") == 1335831723  # Argo UI's own test vector
    wf = Workflow(
        **{
            "metadata": {"name": "w"},
            "spec": {},
            "status": fake_argo.status("w", "Running", [fake_argo.prepare("Running")]),
        }
    )
    [(pod, label)] = pods_by_step(wf)["prepare"]
    assert pod == f"w-prepare-{fake_argo.fnv32a('w.prepare(0)')}" and label == "prepare"
    node = next(n for n in wf.status.nodes.values() if n.type == "Pod")
    assert pod_name("w", node, "v1") == node.id


# ---- stop ------------------------------------------------------------------------------------


def test_stop_asks_argo_to_stop_and_the_gate_still_answers(argo):
    argo.add("ab-sweep-abcde", "never_ends")
    r = sweep("stop", "ab-sweep-abcde", *server_args(argo))
    assert r.returncode == 0, r.stderr
    [put] = [q for q in argo.requests if q["method"] == "PUT"]
    assert put["path"] == "/api/v1/workflows/perception/ab-sweep-abcde/stop"
    r = sweep("status", "ab-sweep-abcde", *server_args(argo))
    assert r.returncode == 3 and "Stopped with strategy 'Stop'" in r.stdout and "decision: refused" in r.stdout


def test_stop_of_an_unknown_workflow_posts_nothing(argo):
    r = sweep("stop", "ab-sweep-nope", *server_args(argo))
    assert r.returncode == 2
    assert not [q for q in argo.requests if q["method"] == "PUT"]
