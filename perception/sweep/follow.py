"""Following a submitted sweep: what its steps are doing, and what the gate decided.

`snapshot(workflow)` reads Argo's node status (pure, no I/O); `changes` says what moved between two
snapshots in one line each; `outcome` turns a snapshot into the exit code of `submit --wait` and
`status`; `wait` polls until the workflow ends or the timeout passes.

Argo's node tree: a template with a retryStrategy becomes a node of type Retry whose children are
one Pod node per attempt; without retries the Pod node stands alone. A step here is either of those
(never an attempt), so a preempted training is one step whose `retries` grows.

A sequential study (`-p design=sequential`) has a `look` step per wave instead of one `gate`: each look's
decision (`continue` until the last) and its JSON line (W, G, look k of R) are its outputs, printed one line
per look as they come; only a look's final decision, not `continue`, is the sweep's decision.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Optional

from perception.exits import EXIT_DECIDED, EXIT_FAILED, EXIT_REFUSED, REFUSED
from perception.run_id import run_name

FINISHED = ("Succeeded", "Failed", "Error")  # Argo's final workflow phases
NO_DECISION = ("", "none")  # "none": the output's default, when the gate never wrote the file
GATE_TEMPLATE = "gate"
LOOK_TEMPLATE = "look"  # the gate at one look of a sequential study
DECISION_OUTPUT = "decision"
SUMMARY_OUTPUT = "summary"  # a look's JSON line, as perception-gate prints it
CONTINUE = "continue"  # a look's decision while the study goes on: no decision yet
SWEEP_ID_PARAMETER = "sweep-id"
SWEEP_ID_LABEL = "perception/sweep-id"


@dataclass(frozen=True)
class Step:
    label: str  # "shared-f0" for a training (its run directory's name), else the task's name
    template: str
    phase: str  # Pending, Running, Succeeded, Failed, Error, Omitted, Skipped
    retries: int  # attempts after the first
    message: str  # the latest attempt's, else why the one before it ended (e.g. "imminent node shutdown")
    started: Optional[datetime] = None


@dataclass(frozen=True)
class Look:
    """One look of a sequential study, from its step's inputs and outputs."""

    look: int
    max_looks: Optional[int]  # from the gate's line, else the workflow's max-replicates
    phase: str
    decision: Optional[str]  # continue, a decision word or refused; None until the gate wrote it
    W: Optional[float] = None
    G: Optional[float] = None

    def line(self) -> str:
        head = f"look {self.look}/{self.max_looks or '?'}: "
        if self.decision is None:
            return head + (
                "no decision" + (f" (step {self.phase})" if self.phase in ("Failed", "Error") else "")
                if self.phase in FINISHED
                else self.phase.lower()
            )
        numbers = ", ".join(f"{k} {v:+.4f}" for k, v in (("W", self.W), ("G", self.G)) if v is not None)
        return head + self.decision + (f" ({numbers})" if numbers else "")


@dataclass(frozen=True)
class Snapshot:
    name: str
    sweep_id: str
    phase: str
    progress: str  # Argo's "done/total" over pods
    message: str
    steps: tuple[Step, ...]
    decision: Optional[str]  # the gate's output once written: a decision word or "refused"
    looks: tuple[Look, ...] = ()  # a sequential study's, in order

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED


def snapshot(workflow) -> Snapshot:
    """A hera Workflow model (as WorkflowsService.get_workflow returns it) → Snapshot."""
    status = workflow.status
    nodes = dict((status.nodes if status else None) or {})
    attempts = {c for n in nodes.values() if n.type == "Retry" for c in (n.children or [])}
    steps = [_step(n, nodes) for n in nodes.values() if n.type in ("Retry", "Pod") and n.id not in attempts]
    steps.sort(key=lambda s: (s.started is None, s.started or datetime.min, s.label))
    return Snapshot(
        name=workflow.metadata.name,
        sweep_id=sweep_id_of(workflow),
        phase=(status.phase if status else None) or "Pending",  # no status yet: not picked up
        progress=(status.progress if status else None) or "",
        message=(status.message if status else None) or "",
        steps=tuple(steps),
        decision=_decision(nodes),
        looks=_looks(nodes, attempts, _parameters(workflow).get("max-replicates")),
    )


def sweep_id_of(workflow) -> str:
    """The `sweep-id` parameter when set, else the sweep-id label, else the workflow's name (the
    workflow's own default)."""
    value = _parameters(workflow).get(SWEEP_ID_PARAMETER) or ""
    if value and "{{" not in value:
        return value
    labels = workflow.metadata.labels or {}
    return labels.get(SWEEP_ID_LABEL) or workflow.metadata.name


def _parameters(workflow) -> dict[str, Optional[str]]:
    return {
        p.name: p.value
        for p in ((workflow.spec.arguments.parameters or []) if workflow.spec and workflow.spec.arguments else [])
    }


def outcome(s: Snapshot) -> Optional[int]:
    """0 a decision, 3 refused, 1 ended without a decision; None while it may still come."""
    if s.decision == REFUSED:
        return EXIT_REFUSED
    if s.decision:
        return EXIT_DECIDED
    return EXIT_FAILED if s.finished else None


def changes(before: Optional[Snapshot], after: Snapshot, now: Optional[datetime] = None) -> list[str]:
    """One line per step that appeared, changed phase or retried, per look that decided (after its step's
    line), and per workflow phase change."""
    stamp = (now or datetime.now()).strftime("%H:%M:%S")
    old = {s.label: s for s in (before.steps if before else ())}
    decided = {look_label(k.look): k.decision for k in (before.looks if before else ())}
    looks = {look_label(k.look): k for k in after.looks}
    lines = []
    for s in after.steps:
        prev = old.get(s.label)
        if prev is not None and s.retries > prev.retries:
            lines.append(f"{stamp} {s.label}: retry {s.retries}" + (f" after: {s.message}" if s.message else ""))
        if prev is None or prev.phase != s.phase:
            failed = s.phase in ("Failed", "Error") and s.message
            lines.append(f"{stamp} {s.label}: {s.phase}" + (f" ({s.message})" if failed else ""))
        look = looks.get(s.label)  # a look's step: what it decided, once, after the step's own line
        if look is not None and look.decision is not None and decided.get(s.label) != look.decision:
            lines.append(f"{stamp} {look.line()}")
    line = f"{stamp} {after.name}: {after.phase}" + (f" ({after.message})" if after.message else "")
    if before is None:
        lines.insert(0, line)
    elif before.phase != after.phase:  # after its steps: a workflow ends once they have
        lines.append(line)
    return lines


def status_lines(s: Snapshot) -> list[str]:
    """The `status` table: the workflow, each step, the decision."""
    lines = [
        f"{s.name}: {s.phase}"
        + (f", progress {s.progress}" if s.progress else "")
        + (f" ({s.message})" if s.message else "")
    ]
    width = max([len(st.label) for st in s.steps] + [4])
    for st in s.steps:
        extra = f"  retries {st.retries}" if st.retries else ""
        if st.message and (st.retries or st.phase in ("Failed", "Error")):
            extra += f"  ({st.message})"
        lines.append(f"  {st.label:<{width}}  {st.phase}{extra}")
    lines += [k.line() for k in s.looks]
    lines.append(f"decision: {s.decision or ('none' if s.finished else 'not yet')}")
    return lines


def summary_lines(s: Snapshot, link: str) -> list[str]:
    """Where to read the result: the Argo page and the MLflow filter of the sweep's runs."""
    return [f"argo: {link}", f"mlflow: tags.sweep_id = '{s.sweep_id}'"]


@dataclass(frozen=True)
class Waited:
    last: Optional[Snapshot]  # None: the server never answered
    timed_out: bool


def wait(
    get: Callable[[], object],
    poll_interval: float,
    timeout: Optional[float],
    out: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Waited:
    """Polls `get()` (the workflow) until it ends or `timeout` seconds pass, printing changes.

    An unreachable server or a 5xx is waited out (one line when it goes, one when it is back): a
    three-day sweep outlives network blips. Any other error (token, name) is raised."""
    from perception.sweep.argo_api import ArgoError

    deadline = None if timeout is None else clock() + timeout
    last: Optional[Snapshot] = None
    unreachable = False
    while True:
        try:
            current = snapshot(get())
        except ArgoError as exc:
            if not exc.transient:
                raise
            if not unreachable:
                out(f"{datetime.now():%H:%M:%S} server unreachable, retrying every {poll_interval:g} s: {exc}")
            unreachable, current = True, None
        if current is not None:
            if unreachable:
                out(f"{datetime.now():%H:%M:%S} server reachable again")
                unreachable = False
            for line in changes(last, current):
                out(line)
            last = current
            if current.finished:
                return Waited(last, timed_out=False)
        if deadline is not None and clock() >= deadline:
            return Waited(last, timed_out=True)
        sleep(poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - clock())))


def _step(node, nodes: dict) -> Step:
    children = [nodes[c] for c in (node.children or []) if c in nodes] if node.type == "Retry" else []
    messages = [c.message for c in reversed(children) if c.message] + [node.message or ""]
    return Step(
        label=step_label(node),
        template=template_of(node),
        phase=node.phase or "Pending",
        retries=max(0, len(children) - 1),
        message=messages[0],
        started=getattr(node.started_at, "root", None),
    )


def step_label(node) -> str:
    """A training's run name (arm, fold, replicate from its inputs), which reads the same whether
    the task was written out or fanned out with withParam ("train(0:{...})")."""
    params = _inputs(node)
    look = params.get("look") or ""
    if template_of(node) == LOOK_TEMPLATE and look.isdigit():
        return look_label(int(look))  # one per wave, each named `look` in its own wave
    arm = params.get("arm") or params.get("variant")
    fold = params.get("fold")
    if arm and fold is not None and str(fold).isdigit():
        replicate = params.get("replicate") or "0"
        return run_name(arm, int(fold), int(replicate) if str(replicate).isdigit() else 0)
    return node.display_name or node.name or node.id


def look_label(look: int) -> str:
    return f"look-{look}"


def _inputs(node) -> dict[str, Optional[str]]:
    return {p.name: p.value for p in ((node.inputs.parameters or []) if node.inputs else [])}


def _outputs(node) -> dict[str, str]:
    return {p.name: (p.value or "").strip() for p in ((node.outputs.parameters or []) if node.outputs else [])}


def template_of(node) -> str:
    if node.template_name:
        return node.template_name
    return getattr(node.template_ref, "template", "") or ""


def _decision(nodes: dict) -> Optional[str]:
    """The gate's `decision` output; of several gate nodes (a Retry and its attempts, which agree),
    the one that finished last."""
    found = []
    for n in nodes.values():
        if template_of(n) not in (GATE_TEMPLATE, LOOK_TEMPLATE):
            continue
        value = _outputs(n).get(DECISION_OUTPUT, "")
        if value not in NO_DECISION and value != CONTINUE:
            finished = getattr(n.finished_at, "root", None)
            found.append((finished.timestamp() if finished else 0.0, value))
    return max(found)[1] if found else None


def _looks(nodes: dict, attempts: set, max_replicates: Optional[str]) -> tuple[Look, ...]:
    """Each look step (a Retry node, or a Pod without retries; never an attempt), by its look number."""
    looks = {}
    for n in nodes.values():
        number = str(_inputs(n).get("look") or "")
        if (
            template_of(n) != LOOK_TEMPLATE
            or n.type not in ("Retry", "Pod")
            or n.id in attempts
            or not number.isdigit()
        ):
            continue
        out = _outputs(n)
        line = _json_line(out.get(SUMMARY_OUTPUT, ""))
        decision = out.get(DECISION_OUTPUT)
        most = line.get("max_looks") or (int(max_replicates) if max_replicates and max_replicates.isdigit() else None)
        looks[int(number)] = Look(
            int(number),
            most,
            n.phase or "Pending",
            None if decision in (None, *NO_DECISION) else decision,
            _number(line.get("W")),
            _number(line.get("G")),
        )
    return tuple(looks[k] for k in sorted(looks))


def _json_line(text: str) -> dict:
    """The gate's JSON line; anything else (no file: the output's default `{}`) reads as empty."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _number(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
