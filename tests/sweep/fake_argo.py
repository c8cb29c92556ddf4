"""A local Argo server for the sweep commands' tests: create, get, list, log and stop, with the
bearer token checked and posted workflows validated by the strict schema.

A created workflow plays a script: each GET shows the next status in it, then the last one for
ever. Scripts are built from steps the way Argo's controller records them: the DAG node, one Retry
node per task (templates have a retryStrategy) with one Pod node per attempt; trainings carry their
inputs (variant, fold); the gate's Pod and Retry nodes carry the `decision` output."""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlparse

from perception.sweep.schema import schema_errors

TOKEN = "s3cr3t-token"
TRAININGS = [(v, f) for f in (0, 1, 2) for v in ("shared", "per_horizon")]


def reply_json(handler: BaseHTTPRequestHandler, code: int, obj: dict) -> None:
    """One JSON answer, as the Argo server gives it."""
    data = json.dumps(obj).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def fnv32a(text: str) -> int:  # Argo's pod-name hash, written out independently of the product's
    h = 2166136261
    for b in text.encode():
        h ^= b
        h = (h * 16777619) % 2**32
    return h


@dataclass
class Task:
    """One DAG task: a phase per attempt, e.g. ["Failed", "Running"] for a preempted, retried one."""

    name: str
    template: str
    attempts: list[str]
    message: str = ""  # the first attempt's, when it failed
    inputs: dict = field(default_factory=dict)
    decision: Optional[str] = None
    summary: Optional[dict] = None  # a look's JSON line (its `summary` output)


def status(wf: str, phase: str, tasks: list[Task], message: str = "") -> dict:
    nodes = {
        wf: {
            "id": wf,
            "name": wf,
            "displayName": wf,
            "type": "DAG",
            "templateName": "ab-sweep",
            "phase": phase,
            "children": [],
        }
    }
    done = 0
    for i, t in enumerate(tasks):
        node_name = f"{wf}.{t.name}"
        rid = f"{wf}-{fnv32a(node_name)}"
        shown = t.name.rsplit(".", 1)[-1]  # a nested task's name is its own: wf.waves.next.look shows `look`
        retry = {
            "id": rid,
            "name": node_name,
            "displayName": shown,
            "type": "Retry",
            "templateName": t.template,
            "phase": t.attempts[-1],
            "startedAt": f"2026-01-01T00:{i:02d}:00Z",
            "children": [],
        }
        if t.inputs:
            retry["inputs"] = {"parameters": [{"name": k, "value": str(v)} for k, v in t.inputs.items()]}
        for a, attempt_phase in enumerate(t.attempts):
            pod_node = f"{node_name}({a})"
            pid = f"{wf}-{fnv32a(pod_node)}"
            pod = {
                "id": pid,
                "name": pod_node,
                "displayName": f"{shown}({a})",
                "type": "Pod",
                "templateName": t.template,
                "phase": attempt_phase,
                "startedAt": f"2026-01-01T00:{i:02d}:{a:02d}Z",
            }
            if a == 0 and t.message:
                pod["message"] = t.message
            if t.decision is not None and a == len(t.attempts) - 1:
                outputs = [{"name": "decision", "value": t.decision}]
                if t.summary is not None:
                    outputs.append({"name": "summary", "value": json.dumps(t.summary)})
                pod["outputs"] = retry["outputs"] = {"parameters": outputs}
                pod["finishedAt"] = retry["finishedAt"] = "2026-01-01T01:00:00Z"
            nodes[pid] = pod
            retry["children"].append(pid)
        nodes[rid] = retry
        nodes[wf]["children"].append(rid)
        done += sum(p == "Succeeded" for p in t.attempts)
    pods = sum(len(t.attempts) for t in tasks)
    out = {"phase": phase, "progress": f"{done}/{max(pods, 1)}", "nodes": nodes, "startedAt": "2026-01-01T00:00:00Z"}
    if message:
        out["message"] = message
    return out


def trainings(phase: str, replicate: Optional[int] = None, **special: list[str]) -> list[Task]:
    """The six trainings; with `replicate`, one wave of a sequential study (named as the recursion nests)."""
    wave = "" if replicate is None else "waves." + "next." * replicate
    return [
        Task(
            f"{wave}train-{v.replace('_', '-')}-f{f}",
            "train",
            special.get(f"{v}_f{f}", [phase]),
            message="imminent node shutdown" if len(special.get(f"{v}_f{f}", [])) > 1 else "",
            inputs={"variant": v, "fold": f, **({} if replicate is None else {"replicate": replicate})},
        )
        for v, f in TRAININGS
    ]


def look(k: int, phase: str, decision: Optional[str] = None, W: float = 0.0, G: float = 0.0) -> Task:
    """The gate at look k of 3, its JSON line written once it decided."""
    line = (
        None
        if decision is None
        else {"decision": decision, "W": W, "G": G, "look": k, "max_looks": 3, "design": "sequential"}
    )
    return Task(
        "waves." + "next." * (k - 1) + "look", "look", [phase], inputs={"look": k}, decision=decision, summary=line
    )


def prepare(phase: str) -> Task:
    return Task("prepare", "prepare", [phase])


def gate(phase: str, decision: Optional[str] = None) -> Task:
    return Task("gate", "gate", [phase], decision=decision)


def script(kind: str, wf: str) -> list[dict]:
    """succeeds (with one preempted, retried training), fails (no decision), refused, never_ends; a
    sequential study's looks: sequential (continue, then ship), sequential_stopped (stopped after look 1)."""
    start = [
        status(wf, "Running", [prepare("Running")]),
        status(wf, "Running", [prepare("Succeeded")] + trainings("Running")),
    ]
    if kind == "succeeds":
        return start + [
            status(wf, "Running", [prepare("Succeeded")] + trainings("Running", shared_f0=["Failed", "Running"])),
            status(
                wf,
                "Running",
                [prepare("Succeeded")] + trainings("Succeeded", shared_f0=["Failed", "Succeeded"]) + [gate("Running")],
            ),
            status(
                wf,
                "Succeeded",
                [prepare("Succeeded")]
                + trainings("Succeeded", shared_f0=["Failed", "Succeeded"])
                + [gate("Succeeded", "ship_per_horizon")],
            ),
        ]
    if kind == "fails":
        return [
            status(wf, "Running", [prepare("Running")]),
            status(
                wf,
                "Failed",
                [Task("prepare", "prepare", ["Failed"], message="Error (exit code 1)")],
                message="child 'prepare' failed",
            ),
        ]
    if kind == "refused":
        return start + [
            status(
                wf,
                "Failed",
                [prepare("Succeeded")]
                + trainings("Succeeded", per_horizon_f1=["Failed"])
                + [gate("Failed", "refused")],
                message="child 'gate' failed",
            ),
        ]
    if kind == "never_ends":
        return start
    if kind in ("sequential", "sequential_stopped"):  # looks 1 and 2 of 3: continue, then a decision
        done0 = [prepare("Succeeded")] + trainings("Succeeded", replicate=0)
        look1 = done0 + [look(1, "Succeeded", "continue", W=0.0123, G=0.0031)]
        if kind == "sequential_stopped":  # Argo's stop during wave 1: no decision
            return [
                status(wf, "Running", done0 + [look(1, "Running")]),
                status(wf, "Running", look1 + trainings("Running", replicate=1)),
                status(wf, "Failed", look1 + trainings("Failed", replicate=1), message="Stopped with strategy 'Stop'"),
            ]
        return [
            status(wf, "Running", [prepare("Running")]),
            status(wf, "Running", done0 + [look(1, "Running")]),
            status(wf, "Running", look1 + trainings("Running", replicate=1)),
            status(wf, "Running", look1 + trainings("Succeeded", replicate=1) + [look(2, "Running")]),
            status(
                wf,
                "Succeeded",
                look1
                + trainings("Succeeded", replicate=1)
                + [look(2, "Succeeded", "ship_per_horizon", W=0.0311, G=0.0102)],
            ),
        ]
    raise ValueError(kind)


def stopped(wf: str) -> dict:
    """After Argo's stop: running pods end, the gate (run as it would after a stop) refuses."""
    return status(
        wf,
        "Failed",
        [prepare("Succeeded")] + trainings("Failed") + [gate("Failed", "refused")],
        message="Stopped with strategy 'Stop'",
    )


class FakeArgo:
    def __init__(self, next_script: str = "succeeds"):
        self.next_script = next_script
        self.requests: list[dict] = []
        self.workflows: dict[str, dict] = {}  # name → {"workflow": ..., "script": [...], "i": int}
        self.log_delay = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's names)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not self._authorised("POST"):
                    return
                wf = json.loads(body).get("workflow", {})
                errors = schema_errors(wf)
                fake.requests[-1]["errors"] = errors
                if errors:
                    return self._reply(400, {"code": 3, "message": f"invalid workflow: {errors[:3]}"})
                name = wf["metadata"].get("name") or wf["metadata"]["generateName"] + f"x{len(fake.workflows)}k2p"
                wf["metadata"]["name"] = name
                fake.requests[-1]["workflow"] = copy.deepcopy(wf)
                params = {p["name"]: p.get("value", "") for p in wf["spec"]["arguments"].get("parameters", [])}
                labels = wf["metadata"].setdefault("labels", {})  # the controller's workflowMetadata.labelsFrom
                labels.setdefault("perception/sweep-id", params.get("sweep-id") or name)
                fake.workflows[name] = {"workflow": wf, "script": script(fake.next_script, name), "i": 0}
                self._reply(200, wf)

            def do_GET(self):  # noqa: N802
                if not self._authorised("GET"):
                    return
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                parts = url.path.strip("/").split("/")  # api v1 workflows ns [name [log]]
                fake.requests[-1]["query"] = query
                if len(parts) == 4:
                    return self._reply(200, {"metadata": {}, "items": fake.listed(query)})
                entry = fake.workflows.get(parts[4])
                if entry is None:
                    return self._reply(404, {"code": 5, "message": f'workflows.argoproj.io "{parts[4]}" not found'})
                if len(parts) == 6 and parts[5] == "log":
                    return self._stream(fake.log_lines(parts[4], query.get("podName")))
                self._reply(200, fake.current(parts[4], advance=True))

            def do_PUT(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not self._authorised("PUT"):
                    return
                parts = urlparse(self.path).path.strip("/").split("/")
                entry = fake.workflows.get(parts[4])
                if entry is None or parts[-1] != "stop":
                    return self._reply(404, {"code": 5, "message": "not found"})
                entry["script"], entry["i"] = [stopped(parts[4])], 0
                self._reply(200, fake.current(parts[4]))

            def _authorised(self, method: str) -> bool:
                fake.requests.append({"method": method, "path": self.path, "auth": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._reply(401, {"code": 16, "message": "token not valid"})
                    return False
                return True

            def _reply(self, code: int, obj: dict) -> None:
                reply_json(self, code, obj)

            def _stream(self, lines: list[dict]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                for obj in lines:  # newline-delimited JSON, as the Argo server streams it
                    self.wfile.write((json.dumps(obj) + "\n").encode())
                    self.wfile.flush()
                    time.sleep(fake.log_delay)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, name: str, kind: str, labels: Optional[dict] = None, at_end: bool = False) -> None:
        """A workflow already on the server (as if submitted earlier), at its script's start or end."""
        wf = {
            "metadata": {"name": name, "namespace": "perception", "labels": labels or {}},
            "spec": {"arguments": {"parameters": []}},
        }
        s = script(kind, name)
        self.workflows[name] = {"workflow": wf, "script": s, "i": len(s) - 1 if at_end else 0}

    def current(self, name: str, advance: bool = False) -> dict:
        entry = self.workflows[name]
        wf = dict(entry["workflow"], status=entry["script"][min(entry["i"], len(entry["script"]) - 1)])
        if advance:
            entry["i"] += 1
        return wf

    def listed(self, query: dict) -> list[dict]:
        """Label selectors of `k=v` and `k!=v` terms; the controller's `completed` label follows the phase."""
        terms = [t for t in query.get("listOptions.labelSelector", "").split(",") if t]
        out = []
        for name in self.workflows:
            wf = self.current(name)
            done = wf["status"]["phase"] in ("Succeeded", "Failed", "Error")
            labels = {**(wf["metadata"].get("labels") or {}), "workflows.argoproj.io/completed": str(done).lower()}
            if all(
                labels.get(t.split("!=")[0]) != t.split("!=")[1]
                if "!=" in t
                else labels.get(t.split("=")[0]) == t.split("=", 1)[1]
                for t in terms
            ):
                out.append(wf)
        return out

    def pods(self, name: str) -> dict[str, str]:
        """pod name → node display name, for every Pod node so far (v2 pod names)."""
        wf = self.current(name)
        return {
            f"{name}-{n['templateName']}-{fnv32a(n['name'])}": n["displayName"]
            for n in wf["status"]["nodes"].values()
            if n["type"] == "Pod"
        }

    def log_lines(self, name: str, pod: Optional[str]) -> list[dict]:
        return [
            {"result": {"podName": p, "content": f"hello from {display} line {i}"}}
            for p, display in self.pods(name).items()
            if pod in (None, p)
            for i in range(2)
        ]


def serve(next_script: str = "succeeds") -> FakeArgo:
    fake = FakeArgo(next_script)
    fake.thread.start()
    return fake
