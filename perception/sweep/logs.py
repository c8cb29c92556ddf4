"""The pods' logs of a sweep, labelled by step ("shared-f0: …", a retried one "shared-f0(1): …").

Argo's log endpoint selects a pod by its name, which the node status does not carry: it is derived
from the node (Argo's GeneratePodName), as the Argo UI derives it."""

from __future__ import annotations

from typing import Callable, Optional

from perception.errors import ConfigError
from perception.sweep.follow import snapshot, step_label, template_of

POD_NAME_FORMAT = "workflows.argoproj.io/pod-name-format"  # workflow annotation: v1 or v2 (default)
MAX_POD_PREFIX = 253 - 10 - 1  # k8s name limit, minus the hash, minus its dash


def fnv32a(text: str) -> int:
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def pod_name(workflow_name: str, node, version: str = "v2") -> str:
    """Argo's pod name of a Pod node: v1 the node id; v2 `<workflow>-<template>-<fnv32a(node name)>`."""
    if version == "v1" or not template_of(node):
        return node.id
    if node.name == workflow_name:
        return workflow_name
    prefix = workflow_name if ".inline" in node.name else f"{workflow_name}-{template_of(node)}"
    return f"{prefix[:MAX_POD_PREFIX]}-{fnv32a(node.name)}"


def pods_by_step(workflow) -> dict[str, list[tuple[str, str]]]:
    """Step label → [(pod name, line label)] in attempt order, for every step that ran a pod."""
    name = workflow.metadata.name
    version = (workflow.metadata.annotations or {}).get(POD_NAME_FORMAT, "v2")
    nodes = dict((workflow.status.nodes if workflow.status else None) or {})
    attempts = {c for n in nodes.values() if n.type == "Retry" for c in (n.children or [])}
    out: dict[str, list[tuple[str, str]]] = {}
    for n in nodes.values():
        if n.type not in ("Retry", "Pod") or n.id in attempts:
            continue
        label = step_label(n)
        pods = [nodes[c] for c in (n.children or []) if c in nodes] if n.type == "Retry" else [n]
        out[label] = [
            (pod_name(name, p, version), label if len(pods) == 1 else f"{label}({i})") for i, p in enumerate(pods)
        ]
    return out


def select(workflow, task: str) -> list[tuple[str, str]]:
    """The pods of `task`: a step label (shared-f0, prepare, gate) or a template name (train: all)."""
    by_step = pods_by_step(workflow)
    if task in by_step:
        return by_step[task]
    matching = [s.label for s in snapshot(workflow).steps if s.template == task]
    if matching:
        return [pod for label in matching for pod in by_step.get(label, [])]
    raise ConfigError(
        f"--task {task!r}: no such step in {workflow.metadata.name}; expected one of "
        f"{sorted(by_step) or ['(no pods yet)']}"
    )


def print_logs(server, name: str, task: Optional[str], follow: bool, out: Callable[[str], None]) -> int:
    """Prints the logs; returns how many lines. With a task and -f, earlier attempts are printed
    whole and the latest is followed."""
    workflow = server.get(name)
    labels = {pod: label for pods in pods_by_step(workflow).values() for pod, label in pods}
    n = 0
    if task is None:
        for line in server.logs(name, follow=follow):
            out(f"{labels.get(line.pod, line.pod)}: {line.content}")
            n += 1
        return n
    pods = select(workflow, task)
    for i, (pod, label) in enumerate(pods):
        for line in server.logs(name, pod=pod, follow=follow and i == len(pods) - 1):
            out(f"{label}: {line.content}")
            n += 1
    return n
