"""The hera-built Argo Workflow: schema-valid, golden, and shaped like the study."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from perception.errors import ConfigError
from perception.sweep.render import render

from perception.sweep.schema import schema_errors

REPO = Path(__file__).resolve().parents[2]
GOLDEN = {False: REPO / "workflows" / "ab_sweep.yaml", True: REPO / "workflows" / "ab_sweep_smoke.yaml"}


@pytest.fixture(scope="module")
def docs() -> dict[bool, dict]:
    return {smoke: yaml.safe_load(render(smoke=smoke)) for smoke in (False, True)}


def templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


def dag_tasks(doc: dict) -> dict[str, dict]:
    dag = templates(doc)[doc["spec"]["entrypoint"]]["dag"]
    return {t["name"]: t for t in dag["tasks"]}


def train_tasks(doc: dict) -> dict[str, dict]:
    return {n: t for n, t in dag_tasks(doc).items() if t["template"] == "train"}


def args_of(task: dict) -> dict[str, str]:
    return {p["name"]: p["value"] for p in task["arguments"]["parameters"]}


@pytest.mark.parametrize("smoke", [False, True], ids=["study", "smoke"])
def test_rendered_yaml_passes_the_strict_validator(smoke, tmp_path):
    out = tmp_path / "wf.yaml"
    cmd = ["perception-sweep", "render", "--out", str(out)] + (["--smoke"] if smoke else [])
    subprocess.run(cmd, check=True, timeout=120)
    r = subprocess.run(["perception-sweep", "validate", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Workflow OK" in r.stdout


def test_the_validator_would_catch_a_misspelled_field(docs):
    broken = copy.deepcopy(docs[False])
    templates(broken)["train"]["container"]["resource"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert schema_errors(docs[False]) == []
    assert any("resource" in msg for _, msg in schema_errors(broken))


@pytest.mark.parametrize("smoke", [False, True], ids=["study", "smoke"])
def test_golden_yaml_matches_the_definition(smoke):
    text = render(smoke=smoke)
    if os.environ.get("PERCEPTION_REGEN_GOLDEN") == "1":
        GOLDEN[smoke].write_text(text)
    assert GOLDEN[smoke].read_text() == text, (
        f"{GOLDEN[smoke].name} is stale; regenerate with PERCEPTION_REGEN_GOLDEN=1 pytest tests/sweep"
    )


def test_hera_generate_yaml_renders_the_study():
    assert shutil.which("hera"), "hera's CLI is not installed: pip install -e '.[test]' brings hera[cli]"
    r = subprocess.run(
        ["hera", "generate", "yaml", str(REPO / "workflows" / "ab_sweep.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == GOLDEN[False].read_text()


@pytest.mark.parametrize("smoke", [False, True], ids=["study", "smoke"])
def test_one_train_task_fans_out_over_the_runs_that_prepare_lists(docs, smoke):
    (task,) = train_tasks(docs[smoke]).values()
    assert task["depends"] == "prepare"
    assert task["withParam"] == "{{tasks.prepare.outputs.parameters.runs}}"
    assert args_of(task) == {
        "arm": "{{item.arm}}",
        "fold": "{{item.fold}}",
        "replicate": "{{item.replicate}}",
        "parent-run-id": "{{tasks.prepare.outputs.parameters.parent-run-id}}",
        "precision": "{{tasks.prepare.outputs.parameters.precision}}",
        "ssd": "{{tasks.prepare.outputs.parameters.ssd}}",
        "fold-embed": "{{tasks.prepare.outputs.parameters.fold-embed}}",
        "chunk": "{{tasks.prepare.outputs.parameters.chunk}}",
        "fused-grn": "{{tasks.prepare.outputs.parameters.fused-grn}}",
    }
    # every training at the sweep's pinned values, which prepare reads off its parent run (a continued sweep's)
    train_args = templates(docs[smoke])["train"]["container"]["args"]
    assert train_args[-5:] == [
        "trainer.precision={{inputs.parameters.precision}}",
        "model.mamba.ssd={{inputs.parameters.ssd}}",
        "model.vsn.fold_embed={{inputs.parameters.fold-embed}}",
        "model.mamba.chunk={{inputs.parameters.chunk}}",
        "model.vsn.fused_grn={{inputs.parameters.fused-grn}}",
    ]
    prepare_args = templates(docs[smoke])["prepare"]["container"]["args"]
    for name in ("arms", "aa", "design"):
        assert "{{workflow.parameters.%s}}" % name in prepare_args
    # one of --replicates (fixed) and --max-replicates (sequential), chosen by the design
    (flag,) = [a for a in prepare_args if "workflow.parameters.replicates" in a]
    assert 'workflow.parameters["max-replicates"]' in flag and "workflow.parameters.design" in flag


@pytest.mark.parametrize(
    "arms, replicates, aa, expected",
    [
        (None, 1, False, {(a, str(f), "0") for a in ("shared", "per_horizon") for f in range(3)}),  # the six
        (
            "shared,per_horizon,shared_skip",
            1,
            False,
            {(a, str(f), "0") for a in ("shared", "per_horizon", "shared_skip") for f in range(3)},
        ),  # nine
        (None, 2, False, {(a, str(f), str(r)) for a in ("shared", "per_horizon") for f in range(3) for r in range(2)}),
        (None, 1, True, {(a, str(f), "0") for a in ("shared", "shared_twin") for f in range(3)}),
        ("shared,per_horizon", 1, True, {(a, str(f), "0") for a in ("shared", "shared_twin") for f in range(3)}),
    ],
)
def test_the_fan_out_follows_the_design(arms, replicates, aa, expected):
    from perception.sweep.design import Design
    from perception.sweep.prepare import fan_out

    items = fan_out("s", 3, Design.of(arms, replicates, aa))
    assert len(items) == len(expected) and {(i["arm"], i["fold"], i["replicate"]) for i in items} == expected


def test_three_arms_render_validates_strictly_and_the_design_is_checked(tmp_path):
    out = tmp_path / "wf.yaml"
    r = subprocess.run(
        ["perception-sweep", "render", "--arms", "shared,per_horizon,shared_skip", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert params["arms"] == "shared,per_horizon,shared_skip"
    assert schema_errors(doc) == []
    r = subprocess.run(
        ["perception-sweep", "render", "--arms", "shared,bogus"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "bogus" in r.stderr and "shared_skip" in r.stderr


def test_each_training_gets_one_l40s_with_cpu_and_memory_requests(docs):
    train = templates(docs[False])["train"]
    res = train["container"]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "1" and res["requests"]["nvidia.com/gpu"] == "1"
    assert res["requests"]["cpu"] and res["requests"]["memory"]
    assert train["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in train["tolerations"]
    assert "trainer.device=cuda" in train["container"]["args"]


def test_smoke_variant_requests_no_gpu_and_runs_the_ci_experiment(docs):
    doc = docs[True]
    train = templates(doc)["train"]
    assert "nvidia.com/gpu" not in str(train["container"]["resources"])
    assert "nodeSelector" not in train and "tolerations" not in train
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert params["experiment"] == "ci" and params["gate-config"] == "auto"


def test_gate_runs_after_every_training_whatever_its_outcome(docs):
    for doc in docs.values():
        tasks = dag_tasks(doc)
        assert tasks["gate"]["depends"] == "prepare && (train.Succeeded || train.Failed || train.Errored)"
        dag = templates(doc)[doc["spec"]["entrypoint"]]["dag"]
        assert dag["failFast"] is False  # a failed training must not stop the gate from being scheduled


def test_preempted_pods_are_retried_and_failures_are_not(docs):
    for name in ("prepare", "train", "gate"):
        retry = templates(docs[False])[name]["retryStrategy"]
        assert retry["retryPolicy"] == "Always"
        assert '"imminent node shutdown"' in retry["expression"] and '"pod deleted"' in retry["expression"]
        assert "exitCode" not in retry["expression"]


def test_mlflow_uri_and_credentials_come_from_the_cluster_never_literal(docs):
    for smoke, doc in docs.items():
        text = render(smoke=smoke)
        assert "mlflow.perception.svc" not in text and "PASSWORD" not in text
        for t in templates(doc).values():
            if "container" in t:
                assert t["container"]["envFrom"] == [
                    {"configMapRef": {"name": "perception-config"}},
                    {"secretRef": {"name": "mlflow-credentials"}},
                ]


def test_workflow_parameters_limits_and_cleanup(docs):
    spec = docs[False]["spec"]
    params = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert params["image"] == "ghcr.io/perception-platform/perception" and params["tag"] == "latest"
    assert params["experiment"] == "production" and params["epochs"] == "30"
    assert spec["serviceAccountName"] == "perception-workflow"
    assert docs[False]["metadata"]["namespace"] == "perception"
    assert spec["activeDeadlineSeconds"] > 0 and spec["podGC"]["strategy"]
    assert spec["ttlStrategy"]["secondsAfterSuccess"] > 0
    train_args = templates(docs[False])["train"]["container"]["args"]
    sweep_id = '{{=workflow.parameters["sweep-id"] != "" ? workflow.parameters["sweep-id"] : workflow.name}}'
    assert params["sweep-id"] == "" and f"sweep_id={sweep_id}" in train_args
    assert spec["workflowMetadata"]["labelsFrom"]["perception/sweep-id"]["expression"] == sweep_id[3:-2]
    assert "experiment={{workflow.parameters.experiment}}" in train_args
    assert "trainer.epochs={{workflow.parameters.epochs}}" in train_args


def test_volumes_are_mounted_per_template_on_the_shared_claims(docs):
    tpl = templates(docs[False])
    mounts = {m["name"]: m for m in tpl["train"]["container"]["volumeMounts"]}
    assert mounts["runs"]["mountPath"] == "/perception-home/runs"
    assert mounts["cache"]["mountPath"] == "/perception-home/cache"
    assert mounts["market-data"]["mountPath"] == "/data" and mounts["market-data"]["readOnly"] is True
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in tpl["train"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"runs": "perception-runs", "cache": "perception-cache", "market-data": "perception-market-data"}
    assert "persistentVolumeClaim" in str(tpl["prepare"]["volumes"])


def test_only_run_ids_and_the_decision_travel_between_steps(docs):
    tpl = templates(docs[False])
    outputs = {n: [p["name"] for p in t.get("outputs", {}).get("parameters", [])] for n, t in tpl.items()}
    assert outputs["prepare"] == [
        "parent-run-id",
        "runs",
        "wave",
        "aheads",
        "control",
        "treatment",
        "gate-config",
        "precision",
        "ssd",
        "fold-embed",
        "chunk",
        "fused-grn",
    ]
    assert outputs["gate"] == ["decision"]
    assert outputs["look"] == ["decision", "summary"]  # the summary: the gate's JSON line, no metrics
    assert outputs["train"] == []


def test_parameters_can_be_overridden_and_are_checked():
    doc = yaml.safe_load(render(params={"tag": "v1.2.0", "epochs": "5"}))
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert params["tag"] == "v1.2.0" and params["epochs"] == "5"
    with pytest.raises(ConfigError, match="'tga' does not exist"):
        render(params={"tga": "v1"})
    with pytest.raises(ConfigError, match="data='parquet'"):
        render(params={"data": "parquet"})


def test_the_workflow_literal_arms_are_the_registry_defaults():
    from perception.arms import DEFAULT_ARMS
    from perception.sweep.render import load_definition

    assert tuple(load_definition().VARIANTS) == DEFAULT_ARMS


def test_the_workflow_literal_pins_are_the_sweeps_pinned_values():
    from perception.sweep.pins import PARAMETERS
    from perception.sweep.render import load_definition

    assert load_definition().PINNED == PARAMETERS


def test_aa_with_other_arms_is_a_usage_error():
    from perception.sweep.design import Design

    with pytest.raises(ConfigError, match="--aa trains the control against its twin"):
        Design.of("shared,shared_skip", 1, True)


def test_calibrate_option_measures_the_noise_before_the_ab_and_the_gate_reads_it(docs):
    from perception.sweep import calibrate
    from perception.sweep.render import load_definition

    definition = load_definition()
    for smoke, doc in docs.items():
        params = {p["name"]: p for p in doc["spec"]["arguments"]["parameters"]}
        assert params["calibrate"]["value"] == "false" and params["calibrate"]["enum"] == ["false", "true"]
        tasks, tpl = dag_tasks(doc), templates(doc)
        calibrating = "{{workflow.parameters.calibrate}} == true"
        # one pod per A/A sweep, numbered as perception-sweep calibrate numbers them
        sweeps = tasks["calibrate"]
        assert sweeps["when"] == calibrating and "depends" not in sweeps
        assert sweeps["withItems"] == [
            {"arm": a, "seed": str(calibrate.SEED_BASE + k)}
            for a in calibrate.SEED_ARMS
            for k in range(definition.CALIBRATION_SWEEPS)
        ]
        sweep_args = tpl["calibrate-sweep"]["container"]["args"]
        assert sweep_args[:9] == [
            "calibrate",
            "--experiment",
            "{{workflow.parameters.experiment}}",
            "--sweeps",
            "1",
            "--arms",
            "{{inputs.parameters.arm}}",
            "--seed-base",
            "{{inputs.parameters.seed}}",
        ]
        assert "--no-write" in sweep_args
        # then the file, from them all; then the A/B, whose gate reads the folder it was written to
        write = tasks["calibrate-write"]
        assert write["when"] == calibrating and write["depends"] == "calibrate.Succeeded || calibrate.Skipped"
        assert tasks["prepare"]["depends"] == "calibrate-write.Succeeded || calibrate-write.Skipped"
        write_args = tpl["calibrate-write"]["container"]["args"]
        assert write_args[:7] == [
            "calibrate",
            "--experiment",
            "{{workflow.parameters.experiment}}",
            "--sweeps",
            str(definition.CALIBRATION_SWEEPS),
            "--seed-base",
            str(calibrate.SEED_BASE),
        ]
        assert "--no-write" not in write_args
        # every step measures and matches at the study's own scale
        scale = [
            o
            for o in tpl["train"]["container"]["args"]
            if o.startswith(("trainer.epochs=", "data")) and not o.startswith("data.fold=")
        ]
        assert all(o in sweep_args and o in write_args for o in scale) and len(scale) == 3
        for name in ("calibrate-write", "gate"):
            env = [e for e in tpl[name]["container"]["env"] if "value" in e]  # the rest: tests/infra
            assert env == [{"name": "PERCEPTION_GATE_NOISE_DIR", "value": definition.NOISE_DIR}]
            mounts = {m["mountPath"] for m in tpl[name]["container"]["volumeMounts"]}
            assert any(definition.NOISE_DIR.startswith(m + "/") for m in mounts)
        if not smoke:
            assert tpl["calibrate-sweep"]["container"]["resources"] == tpl["train"]["container"]["resources"]
            assert tpl["calibrate-sweep"]["retryStrategy"]["limit"] == tpl["train"]["retryStrategy"]["limit"]
            assert "trainer.device=cuda" in sweep_args


def test_calibration_literals_are_the_commands_defaults():
    from perception.sweep import calibrate, cli
    from perception.sweep.render import load_definition

    definition = load_definition()
    assert tuple(definition.CALIBRATION_ARMS) == calibrate.SEED_ARMS
    assert definition.CALIBRATION_SEED_BASE == calibrate.SEED_BASE
    args = cli.parser().parse_args(["calibrate", "--experiment", "ci"])
    assert (args.sweeps, args.seed_base, args.arms.split(",")) == (
        definition.CALIBRATION_SWEEPS,
        calibrate.SEED_BASE,
        list(calibrate.SEED_ARMS),
    )
