"""Every place a workflow step writes is writable in its pod. The smoke workflow's prepare, train and
gate command lines run as their pods run them (the ConfigMap's PERCEPTION_HOME as the working directory,
the image's HOME, a real MLflow server as the tracking URI), with a Python audit hook recording every
file write, directory, rename and program started (tests/infra/write_audit); each recorded path,
mapped back to the pod's paths, must lie on a writable mount of the rendered template, since the
root filesystem is read-only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sweep.argo_eval import substitute
from .manifests import WORKFLOWS, load_workflow, unwritable_paths, workflow_pod_specs

AUDIT = Path(__file__).resolve().parent / "write_audit"
POD_TMP, POD_HOME, POD_PERCEPTION_HOME = "/tmp", "/home/perception", "/perception-home"


def fill(args: list[str], values: dict[str, str]) -> list[str]:
    """A template's args as Argo fills them in (expressions evaluated; `values` are the workflow's and
    the template's inputs)."""
    scope = {
        "workflow.name": "ab-sweep-smoke-x7k2p",
        "workflow.namespace": "perception",
        **{f"{kind}.parameters.{k}": v for k, v in values.items() for kind in ("workflow", "inputs")},
    }
    return [substitute(a, scope) for a in args]


@pytest.mark.slow(seconds=90)
def test_prepare_a_training_and_the_gate_write_only_where_their_pods_can(tmp_path, mlflow_server):
    wf = load_workflow(WORKFLOWS / "ab_sweep_smoke.yaml")
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    specs = {where.rsplit(" ", 1)[1]: (where, spec) for where, spec in workflow_pod_specs(wf)}
    roots = {POD_TMP: tmp_path / "tmp", POD_HOME: tmp_path / "home", POD_PERCEPTION_HOME: tmp_path / "perception-home"}
    for d in roots.values():
        d.mkdir()
    # Inductor exports its cache folder (TORCHINDUCTOR_CACHE_DIR) once a process compiles; a pod starts without it
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MLFLOW_", "PERCEPTION_", "TORCHINDUCTOR_", "TRITON_"))
        },
        "HOME": str(roots[POD_HOME]),
        "TMPDIR": str(roots[POD_TMP]),
        "PERCEPTION_HOME": str(roots[POD_PERCEPTION_HOME]),
        "MLFLOW_TRACKING_URI": mlflow_server,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "2",
        "PYTHONPATH": str(AUDIT),
    }
    values = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    values.update({"sweep-id": "pod-writes", "epochs": "1"})

    def run(name: str, extra: dict[str, str], exit_code: int = 0) -> list[str]:
        """The step's command line in its pod's places; the pod paths it wrote."""
        container, log = templates[name]["container"], tmp_path / f"{name}-writes.log"
        args = [local_path(a) for a in fill(container["args"], {**values, **extra})]
        r = subprocess.run(
            [*container["command"], *args],
            env={**env, "WRITE_AUDIT_LOG": str(log)},
            cwd=roots[POD_PERCEPTION_HOME],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == exit_code, f"{name}: {r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        written = {
            path for event, path in (line.split("\t", 1) for line in log.read_text().splitlines()) if event != "exec"
        }
        outside = sorted(p for p in written if p != "/dev/null" and pod_path(p) is None)
        assert not outside, f"{name} wrote outside its pod's PERCEPTION_HOME, HOME and /tmp: {outside[:20]}"
        return sorted(pod_path(p) for p in written if pod_path(p) is not None)

    def local_path(arg: str) -> str:  # an argument naming a pod path (--out, --outputs) names ours
        return next((str(local) + arg[len(pod) :] for pod, local in roots.items() if arg.startswith(pod + "/")), arg)

    def pod_path(path: str) -> str | None:
        return next(
            (
                pod + path[len(str(local)) :]
                for pod, local in roots.items()
                if path == str(local) or path.startswith(str(local) + "/")
            ),
            None,
        )

    prepared = run("prepare", {})
    outputs = roots[POD_TMP] / "prepare"
    first = yaml.safe_load((outputs / "runs").read_text())[0]
    pinned = ("precision", "ssd", "fold-embed", "chunk", "fused-grn")
    step_outputs = {k: (outputs / k).read_text().strip() for k in ("parent-run-id", *pinned)}
    trained = run("train", {**first, **step_outputs})
    # one training of six: the gate refuses (exit 3), writing its report, the decision file and its run
    gated = run(
        "gate",
        {k: (outputs / k).read_text().strip() for k in ("control", "treatment", "gate-config")}
        | {"argo-ui": "https://argo.example.com/"},
        exit_code=3,
    )

    assert any(p.startswith(POD_PERCEPTION_HOME + "/cache/") for p in prepared)  # the hook saw the work
    assert any(p.startswith(POD_PERCEPTION_HOME + "/runs/pod-writes/") for p in trained)
    assert POD_TMP + "/decision" in gated and any(
        p.startswith(POD_PERCEPTION_HOME + "/runs/pod-writes/gate/") for p in gated
    )
    for name, paths in (("prepare", prepared), ("train", trained), ("gate", gated)):
        where, spec = specs[name]
        assert not unwritable_paths(where, spec, tuple(paths)), unwritable_paths(where, spec, tuple(paths))[:20]
        # what lands in PERCEPTION_HOME's scratch rather than on a claim is lost with the pod: only
        # Hydra's own output may
        claims = [
            m["mountPath"]
            for m in spec["containers"][0]["volumeMounts"]
            if m["mountPath"].startswith(POD_PERCEPTION_HOME + "/")
        ]
        lost = [
            p
            for p in paths
            if p.startswith(POD_PERCEPTION_HOME + "/")
            and not any(p == c or p.startswith(c + "/") for c in claims)
            and not re.match(POD_PERCEPTION_HOME + r"/hydra(-multirun)?(/|$)", p)
        ]
        assert not lost, f"{name} writes into PERCEPTION_HOME's scratch, lost with its pod: {lost[:20]}"
    # each scratch volume is needed: something is written under each
    for pod_root in roots:
        assert any(p == pod_root or p.startswith(pod_root + "/") for p in prepared + trained + gated), pod_root


def test_the_thread_variables_the_pods_set_size_torch_and_inductor():
    """The variables each container takes from its CPU limit are the ones torch's intra-op pool and
    Inductor's compile workers read (1 here: below any machine's core count, so not a default)."""
    wf = load_workflow(WORKFLOWS / "ab_sweep.yaml")
    (train,) = [t for t in wf["spec"]["templates"] if t["name"] == "train"]
    from_limit = {
        e["name"]
        for e in train["container"]["env"]
        if e.get("valueFrom", {}).get("resourceFieldRef", {}).get("resource") == "limits.cpu"
    }
    assert from_limit == {"OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"}
    env = {**os.environ, **{name: "1" for name in from_limit}}
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, torch._inductor.config as c; print(torch.get_num_threads(), c.compile_threads)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"]
