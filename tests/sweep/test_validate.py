"""`render` and `submit` check the workflow's parameters as the pods will use them, and post nothing
on a mistake; `submit --sweep-id` continues a sweep, but not while another workflow works on it."""

from __future__ import annotations

import pytest
import yaml

from perception.errors import ConfigError
from perception.sweep.overrides import resolve_gate_config
from perception.sweep.render import render
from perception.train.compose import composed

from . import fake_argo
from .test_follow import argo, server_args, sweep  # noqa: F401 (the fixture)


def params_of(text: str) -> dict[str, str]:
    return {p["name"]: p["value"] for p in yaml.safe_load(text)["spec"]["arguments"]["parameters"]}


@pytest.mark.parametrize(
    "params, names",
    [
        (
            {"experiment": "local", "gate-config": "default"},
            ["-p gate-config=default", "[6000]", "[10, 30, 100, 300, 1000]"],
        ),
        ({"gate-config": "nope"}, ["-p gate-config=nope", "not found", "shift_viable"]),
        ({"experiment": "nope"}, ["-p experiment=nope", "production"]),
        ({"epochs": "abc"}, ["-p epochs=abc", "trainer.epochs"]),
        ({"epochs": "0"}, ["-p epochs=0", "positive"]),
        ({"data": "dbn"}, ["-p data=dbn", "data-paths"]),
        ({"sweep-id": "bad/id"}, ["-p sweep-id=bad/id", "letters, digits"]),
        ({"sweep-id": "s" * 64}, ["-p sweep-id=" + "s" * 64, "at most 63 characters"]),  # an Argo label value
    ],
)
def test_a_mistake_in_the_parameters_is_named(params, names):
    with pytest.raises(ConfigError) as err:
        render(params=params)
    for name in names:
        assert name in str(err.value)


def test_auto_is_the_gate_config_of_the_experiment():
    assert params_of(render(params={"experiment": "local"}))["gate-config"] == "auto"  # resolved by prepare
    assert resolve_gate_config("auto", composed(["experiment=local", "trainer.epochs=3"])) == "local"
    assert resolve_gate_config("auto", composed(["experiment=production"])) == "default"
    assert resolve_gate_config("shift_viable", composed(["experiment=production"])) == "shift_viable"
    render(params={"data": "dbn", "data-paths": "[/data/ES/*.dbn.zst]"})  # globs are the cluster's: not read here


def test_the_checks_need_no_part_of_the_local_runner():
    from tests.test_layout import PACKAGE, imports

    assert not {m for m in imports(PACKAGE / "sweep" / "validate.py") if m.startswith("perception.sweep.local")}


def test_a_refused_submission_posts_nothing(argo):  # noqa: F811
    r = sweep("submit", *server_args(argo), "-p", "experiment=local", "-p", "gate-config=default")
    assert r.returncode == 2 and "-p gate-config=default" in r.stderr
    assert argo.requests == []


@pytest.mark.slow(seconds=70)
def test_submit_sweep_id_labels_the_workflow_and_waits_for_no_other(argo):  # noqa: F811
    first = sweep("submit", *server_args(argo), "--smoke")
    assert first.returncode == 0, first.stderr
    running = "ab-sweep-smoke-x0k2p"  # labelled with its own name, as the controller labels it

    r = sweep("submit", *server_args(argo), "--smoke", "--sweep-id", running)
    assert r.returncode == 2, r.stderr
    assert f"--sweep-id {running}: {running} (Running) is still working on this sweep" in r.stderr
    assert f"perception-sweep stop {running}" in r.stderr
    assert [q["method"] for q in argo.requests] == ["POST", "GET"]  # the list, and no second POST
    assert "perception/sweep-id=" + running in argo.requests[-1]["query"]["listOptions.labelSelector"]

    argo.workflows[running]["script"] = fake_argo.script("succeeds", running)[-1:]  # it ends
    r = sweep("submit", *server_args(argo), "--smoke", "--sweep-id", running)
    assert r.returncode == 0, r.stderr
    posted = argo.requests[-1]["workflow"]
    assert posted["metadata"]["labels"]["perception/sweep-id"] == running
    assert params_of(yaml.safe_dump(posted))["sweep-id"] == running
