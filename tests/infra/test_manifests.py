"""The Kubernetes manifests: they render, validate strictly against current schemas, run nothing as
root, bound every container, and provide every object the sweep workflow names."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from .manifests import (
    NAMESPACE,
    WORKFLOWS,
    ident,
    load_workflow,
    pod_specs,
    prepare_tree,
    render,
    resource_problems,
    security_problems,
    workflow_references,
)

OVERLAYS = ["base", "l40s"]
KUSTOMIZATIONS = OVERLAYS + ["tools"]  # tools: one-off pods applied on demand
WORKFLOW_FILES = ["ab_sweep.yaml", "ab_sweep_smoke.yaml"]
# Kubernetes minor versions still in upstream support when these manifests were written.
OLDEST_CURRENT = Version("1.33")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return prepare_tree(tmp_path_factory.mktemp("k8s"))


@pytest.fixture(scope="module")
def rendered(tree) -> dict[str, list[dict]]:
    return {name: render(tree / "k8s" / name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def k8s_version() -> str:
    newest = all_versions()[-1]
    assert Version(newest) >= OLDEST_CURRENT, f"kubernetes-validate only knows up to {newest}; upgrade it"
    return newest


def by_ident(resources: list[dict]) -> dict[str, dict]:
    return {ident(r): r for r in resources}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_the_whole_stack(rendered, overlay):
    names = set(by_ident(rendered[overlay]))
    expected = {
        "Namespace/perception",
        "Deployment/mlflow", "Service/mlflow",
        "StatefulSet/postgres", "Service/postgres",
        "StatefulSet/minio", "Service/minio", "Job/minio-create-bucket",
        "ServiceAccount/perception-workflow", "Role/perception-workflow-executor",
        "RoleBinding/perception-workflow-executor",
        "ConfigMap/perception-config",
        "Secret/mlflow-credentials", "Secret/mlflow-db", "Secret/minio-credentials",
        "PersistentVolumeClaim/perception-market-data", "PersistentVolumeClaim/perception-cache",
        "PersistentVolumeClaim/perception-runs",
    }
    assert expected <= names, f"missing from {overlay}: {sorted(expected - names)}"
    for res in rendered[overlay]:
        if res["kind"] not in ("Namespace",):
            assert res["metadata"].get("namespace") == NAMESPACE, f"{ident(res)} is not in {NAMESPACE}"


def test_the_cluster_overlay_adds_gpu_specifics(rendered):
    l40s = by_ident(rendered["l40s"])
    assert l40s["ResourceQuota/perception-gpus"]["spec"]["hard"]["requests.nvidia.com/gpu"] == "6"
    for pvc in ("perception-market-data", "perception-cache", "perception-runs"):
        assert l40s[f"PersistentVolumeClaim/{pvc}"]["spec"].get("storageClassName"), f"{pvc}: no RWX class"


@pytest.mark.parametrize("overlay", KUSTOMIZATIONS)
def test_every_manifest_validates_strictly(rendered, overlay, k8s_version):
    failures = []
    for res in rendered[overlay]:
        try:
            kubernetes_validate.validate(res, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{ident(res)}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not failures, "\n".join(failures)


def test_strict_validation_rejects_a_misspelled_field(rendered, k8s_version):
    deployment = copy.deepcopy(by_ident(rendered["base"])["Deployment/mlflow"])
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, k8s_version, strict=True)


@pytest.mark.parametrize("overlay", KUSTOMIZATIONS)
def test_no_container_runs_as_root_or_privileged(rendered, overlay):
    specs = list(pod_specs(rendered[overlay]))
    assert len(specs) >= (1 if overlay == "tools" else 4)
    problems = [p for where, spec in specs for p in security_problems(where, spec)]
    assert not problems, "\n".join(problems)


def test_the_security_check_catches_a_root_container(rendered):
    (where, spec), *_ = pod_specs([by_ident(rendered["base"])["Deployment/mlflow"]])
    spec = copy.deepcopy(spec)
    spec["securityContext"]["runAsUser"] = 0
    spec["containers"][0]["securityContext"]["privileged"] = True
    problems = security_problems(where, spec)
    assert any("runAsUser is 0" in p for p in problems) and any("privileged" in p for p in problems)


@pytest.mark.parametrize("overlay", KUSTOMIZATIONS)
def test_every_container_has_requests_and_limits(rendered, overlay):
    problems = [p for where, spec in pod_specs(rendered[overlay]) for p in resource_problems(where, spec)]
    assert not problems, "\n".join(problems)


def test_the_resource_check_catches_a_missing_limit(rendered):
    (where, spec), *_ = pod_specs([by_ident(rendered["base"])["StatefulSet/postgres"]])
    spec = copy.deepcopy(spec)
    del spec["containers"][0]["resources"]["limits"]["memory"]
    assert resource_problems(where, spec) == [f"{where} container postgres: no limits.memory"]


@pytest.fixture(scope="module", params=WORKFLOW_FILES)
def workflow(request) -> dict:
    path = WORKFLOWS / request.param
    assert path.is_file(), f"{path} is missing: render it with `perception-sweep render`"
    return load_workflow(path)


def test_every_object_the_workflow_names_exists(rendered, workflow):
    refs = workflow_references(workflow)
    kinds = {kind for kind, _ in refs}
    assert {"ServiceAccount", "ConfigMap", "Secret", "PersistentVolumeClaim"} <= kinds, refs
    for overlay in OVERLAYS:
        have = {(r["kind"], r["metadata"]["name"]) for r in rendered[overlay]}
        missing = sorted(refs - have)
        assert not missing, f"{overlay} lacks what the workflow names: {missing}"
    assert workflow["metadata"].get("namespace", NAMESPACE) == NAMESPACE


def test_workflow_mounts_are_backed_by_shared_claims(rendered, workflow):
    """Six pods mount each claim at once, and the market data is mounted read-only."""
    resources = by_ident(rendered["base"])
    for kind, name in workflow_references(workflow):
        if kind == "PersistentVolumeClaim":
            assert resources[f"{kind}/{name}"]["spec"]["accessModes"] == ["ReadWriteMany"], name
    for template in workflow["spec"]["templates"]:
        for vol in template.get("volumes", []):
            if vol.get("persistentVolumeClaim", {}).get("claimName") == "perception-market-data":
                assert vol["persistentVolumeClaim"].get("readOnly") is True, template["name"]


def test_config_and_secrets_carry_the_keys_the_workflow_reads(rendered):
    resources = by_ident(rendered["base"])
    config = resources["ConfigMap/perception-config"]["data"]
    assert config == {
        "MLFLOW_TRACKING_URI": "http://mlflow.perception.svc.cluster.local:5000",
        "PERCEPTION_HOME": "/perception-home",
    }
    assert set(resources["Secret/mlflow-credentials"]["data"]) == {
        "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    # The tracking URI names the Service: its name, namespace and port must agree.
    service = resources["Service/mlflow"]
    assert [p["port"] for p in service["spec"]["ports"]] == [5000]


def test_gpu_pods_match_the_workflow_training_pods(rendered):
    """The overlay's GPU check is scheduled exactly as the workflow's training pods are."""
    check = by_ident(rendered["l40s"])["Job/perception-gpu-check"]["spec"]["template"]["spec"]
    wf = load_workflow(WORKFLOWS / "ab_sweep.yaml")
    gpu_templates = [
        t for t in wf["spec"]["templates"]
        if "nvidia.com/gpu" in t.get("container", {}).get("resources", {}).get("limits", {})
    ]
    assert gpu_templates, "the workflow has no GPU template"
    for t in gpu_templates:
        assert t["nodeSelector"] == check["nodeSelector"], t["name"]
        assert t["tolerations"] == check["tolerations"], t["name"]
        limits = t["container"]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == check["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]


def test_mlflow_server_flags(rendered):
    """--serve-artifacts (pods need no S3 credentials), --allowed-hosts naming every in-cluster
    name of the Service (MLflow >= 3.5 rejects other Host headers), probes on /health."""
    container = by_ident(rendered["base"])["Deployment/mlflow"]["spec"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    assert "--serve-artifacts" in script
    allowed = script.split('--allowed-hosts "', 1)[1].split('"', 1)[0].split(",")
    for host in ("mlflow", "mlflow.perception", "mlflow.perception.svc", "mlflow.perception.svc.cluster.local"):
        assert host in allowed and f"{host}:5000" in allowed, host
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe


def test_market_data_loader_writes_the_claim_training_reads(rendered):
    (loader,) = [r for r in rendered["tools"] if r["kind"] == "Pod"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in loader["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"perception-market-data"}
    assert "PersistentVolumeClaim/perception-market-data" in by_ident(rendered["base"])
    assert loader["metadata"]["namespace"] == NAMESPACE
