"""The Kubernetes manifests: they render, validate strictly against current schemas, run nothing as
root, bound every container, and provide every object the sweep workflow names."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from perception.testing.mlflow_server import STORE_POOL

from .manifests import (
    INFRA,
    NAMESPACE,
    REPO,
    WORKFLOWS,
    ident,
    load_workflow,
    pod_specs,
    prepare_tree,
    render,
    resource_problems,
    security_problems,
    unwritable_paths,
    workflow_pod_specs,
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
        "Deployment/mlflow",
        "Service/mlflow",
        "StatefulSet/postgres",
        "Service/postgres",
        "StatefulSet/minio",
        "Service/minio",
        "Job/minio-create-bucket",
        "ServiceAccount/perception-workflow",
        "Role/perception-workflow-executor",
        "RoleBinding/perception-workflow-executor",
        "ConfigMap/perception-config",
        "Secret/mlflow-credentials",
        "Secret/mlflow-db",
        "Secret/minio-credentials",
        "PersistentVolumeClaim/perception-market-data",
        "PersistentVolumeClaim/perception-cache",
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
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    }
    # The tracking URI names the Service: its name, namespace and port must agree.
    service = resources["Service/mlflow"]
    assert [p["port"] for p in service["spec"]["ports"]] == [5000]


def test_gpu_pods_match_the_workflow_training_pods(rendered):
    """The overlay's GPU check is scheduled exactly as the workflow's training pods are."""
    check = by_ident(rendered["l40s"])["Job/perception-gpu-check"]["spec"]["template"]["spec"]
    wf = load_workflow(WORKFLOWS / "ab_sweep.yaml")
    gpu_templates = [
        t
        for t in wf["spec"]["templates"]
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
    name of the Service (MLflow >= 3.5 rejects other Host headers), start and readiness on /health,
    liveness on a request that needs the store."""
    container = by_ident(rendered["base"])["Deployment/mlflow"]["spec"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    assert "--serve-artifacts" in script
    allowed = script.split('--allowed-hosts "', 1)[1].split('"', 1)[0].split(",")
    for host in ("mlflow", "mlflow.perception", "mlflow.perception.svc", "mlflow.perception.svc.cluster.local"):
        assert host in allowed and f"{host}:5000" in allowed, host
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
    liveness = container["livenessProbe"]["exec"]["command"]  # a request that needs the store (test_mlflow_server)
    assert liveness[:2] == ["python", "-c"] and "experiments/get-by-name" in liveness[2]


def test_the_tracking_store_pool_cannot_run_dry_and_postgres_admits_it(rendered):
    """MLflow's log_batch holds a pooled connection while it takes a second, so each worker's pool is
    at least twice its 40 request threads (as the test server's, STORE_POOL), and PostgreSQL admits
    two workers' tracking and auth pools."""
    objects = by_ident(rendered["base"])
    mlflow = objects["Deployment/mlflow"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in mlflow["env"]}
    assert {k: env.get(k) for k in STORE_POOL} == STORE_POOL
    pool = int(env["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"]) + int(env["MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW"])
    assert pool >= 2 * 40
    workers = int(mlflow["args"][0].split("--workers ", 1)[1].split()[0])
    postgres = objects["StatefulSet/postgres"]["spec"]["template"]["spec"]["containers"][0]
    (setting,) = [a for a in postgres["args"] if a.startswith("max_connections=")]
    max_connections = int(setting.split("=")[1])
    assert max_connections >= workers * (pool + 40) + 10  # tracking pools, auth's request threads, admin


def test_market_data_loader_writes_the_claim_training_reads(rendered):
    (loader,) = [r for r in rendered["tools"] if r["kind"] == "Pod"]
    claims = {
        v["persistentVolumeClaim"]["claimName"] for v in loader["spec"]["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims == {"perception-market-data"}
    assert "PersistentVolumeClaim/perception-market-data" in by_ident(rendered["base"])
    assert loader["metadata"]["namespace"] == NAMESPACE


WORKFLOW_TEMPLATES = {"prepare", "train", "calibrate-sweep", "calibrate-write", "gate", "look"}
EXECUTOR_SETTING = INFRA / "k8s" / "argo" / "workflow-controller-executor.yaml"


def image_home() -> str:
    (line,) = [ln for ln in (REPO / "Dockerfile").read_text().splitlines() if ln.strip().startswith("HOME=")]
    return line.strip().split("=", 1)[1].split()[0]


def scratch_paths(rendered) -> tuple[str, ...]:
    """Where the steps write outside the claims: tempfile and the step outputs (/tmp), the caches under
    the image's HOME, Hydra's output under the ConfigMap's PERCEPTION_HOME."""
    home = by_ident(rendered["base"])["ConfigMap/perception-config"]["data"]["PERCEPTION_HOME"]
    return "/tmp", image_home(), home


def test_every_workflow_container_is_hardened_bounded_and_has_its_scratch(rendered, workflow):
    specs = dict(workflow_pod_specs(workflow))
    assert WORKFLOW_TEMPLATES <= {where.rsplit(" ", 1)[1] for where in specs}  # and any template added later
    problems = [
        p
        for where, spec in specs.items()
        for p in security_problems(where, spec)
        + resource_problems(where, spec)
        + unwritable_paths(where, spec, scratch_paths(rendered))
    ]
    assert not problems, "\n".join(problems)


def test_workflow_scratch_is_bounded_and_thread_pools_follow_the_cpu_limit(workflow):
    for where, spec in workflow_pod_specs(workflow):
        for vol in spec["volumes"]:
            if "emptyDir" in vol:
                assert vol["emptyDir"].get("sizeLimit"), f"{where}: emptyDir {vol['name']} is unbounded"
        (c,) = spec["containers"]
        env = {e["name"]: e.get("valueFrom", {}).get("resourceFieldRef") for e in c.get("env", [])}
        for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
            assert env.get(name) == {"resource": "limits.cpu", "divisor": "1"}, (where, name)
        # every output file a step writes lies on a writable scratch volume
        outputs = [
            p["valueFrom"]["path"]
            for t in workflow["spec"]["templates"]
            if t["name"] == where.rsplit(" ", 1)[1]
            for p in t.get("outputs", {}).get("parameters", [])
        ]
        assert not unwritable_paths(where, spec, tuple(outputs))


def test_the_workflow_checks_catch_a_writable_root_a_missing_scratch_and_an_unbounded_cpu(workflow):
    where, spec = next(iter(workflow_pod_specs(workflow)))
    spec = copy.deepcopy(spec)
    c = spec["containers"][0]
    del c["securityContext"]["readOnlyRootFilesystem"]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/tmp"]
    del c["resources"]["limits"]["cpu"]
    assert f"{where} container main: readOnlyRootFilesystem is not true" in security_problems(where, spec)
    assert unwritable_paths(where, spec, ("/tmp/prepare",)) == [
        f"{where} container main: nothing writable mounted at /tmp/prepare"
    ]
    assert f"{where} container main: no limits.cpu" in resource_problems(where, spec)


def executor_setting() -> tuple[dict, dict]:
    (patch,) = [d for d in yaml.safe_load_all(EXECUTOR_SETTING.read_text()) if d]
    return patch, yaml.safe_load(patch["data"]["executor"])


def test_argo_init_and_wait_containers_are_hardened_by_the_controller_setting(workflow, k8s_version):
    """The executor setting validates as a container, and Argo's init and wait containers built from
    it, in a pod with the workflow's pod-level security context, pass the same checks."""
    patch, executor = executor_setting()
    assert (patch["kind"], patch["metadata"]["name"]) == ("ConfigMap", "workflow-controller-configmap")
    kubernetes_validate.validate(patch, k8s_version, strict=True)
    argo = [{"name": name, "image": "quay.io/argoproj/argoexec:v4.0.0", **executor} for name in ("init", "wait")]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "executor", "namespace": NAMESPACE},
        "spec": {
            "securityContext": workflow["spec"]["securityContext"],
            "initContainers": argo[:1],
            "containers": argo[1:],
        },
    }
    kubernetes_validate.validate(pod, k8s_version, strict=True)
    where = f"{workflow['metadata']['generateName']} executor"
    problems = security_problems(where, pod["spec"]) + resource_problems(where, pod["spec"])
    assert not problems, "\n".join(problems)
