"""`perception-sweep submit` against a local Argo-like server that checks the bearer token and
validates the posted workflow with the same strict schema."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from perception.sweep.schema import schema_errors
from .fake_argo import reply_json

TOKEN = "s3cr3t-token"


class FakeArgo:
    """Answers POST /<prefix>api/v1/workflows/<namespace> like the Argo server does."""

    def __init__(self):
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.requests.append({"path": self.path, "auth": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._reply(401, {"code": 16, "message": "token not valid"})
                wf = json.loads(body).get("workflow", {})
                errors = schema_errors(wf)
                fake.requests[-1]["errors"] = errors
                if errors:
                    return self._reply(400, {"code": 3, "message": f"invalid workflow: {errors[:3]}"})
                wf.setdefault("metadata", {})["name"] = wf["metadata"]["generateName"] + "x7k2p"
                fake.requests[-1]["workflow"] = wf
                self._reply(200, wf)

            def _reply(self, code: int, obj: dict) -> None:
                reply_json(self, code, obj)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def argo():
    fake = FakeArgo()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def submit(*args: str, token: str | None = TOKEN, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed command with none of the caller's ARGO_* settings; the fake server speaks plain http,
    which is asked for explicitly (--secure=false) unless `env` says otherwise."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
    if token is not None:
        full["ARGO_TOKEN"] = token
    plain = [] if env is not None else ["--secure=false"]
    full.update(env or {})
    return subprocess.run(
        ["perception-sweep", "submit", *args, *plain], env=full, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("smoke", [False, True], ids=["study", "smoke"])
def test_submit_posts_a_valid_workflow_and_prints_its_name_and_link(argo, smoke):
    r = submit("--host", argo.url, "--namespace", "perception", *(["--smoke"] if smoke else []))
    assert r.returncode == 0, r.stderr
    [req] = argo.requests
    assert req["path"] == "/api/v1/workflows/perception"
    assert req["errors"] == []
    name = req["workflow"]["metadata"]["name"]
    assert name == ("ab-sweep-smoke-x7k2p" if smoke else "ab-sweep-x7k2p")
    assert name in r.stdout
    assert f"{argo.url}/workflows/perception/{name}" in r.stdout
    tasks = {t["name"]: t for t in req["workflow"]["spec"]["templates"][-1]["dag"]["tasks"]}
    # the calibration steps run only with -p calibrate=true; the trainings fan out from prepare's list
    # (the fixed design's train and gate, or the sequential design's waves)
    assert list(tasks) == ["calibrate", "calibrate-write", "prepare", "train", "gate", "waves"]
    assert tasks["calibrate"]["when"] == tasks["calibrate-write"]["when"] == "{{workflow.parameters.calibrate}} == true"
    assert tasks["train"]["withParam"] == "{{tasks.prepare.outputs.parameters.runs}}"


def test_parameters_travel_with_the_submission(argo):
    r = submit("--host", argo.url, "--namespace", "research", "-p", "tag=v1.2.0", "-p", "epochs=12")
    assert r.returncode == 0, r.stderr
    [req] = argo.requests
    assert req["path"] == "/api/v1/workflows/research"
    params = {p["name"]: p["value"] for p in req["workflow"]["spec"]["arguments"]["parameters"]}
    assert params["tag"] == "v1.2.0" and params["epochs"] == "12"
    assert params["argo-ui"] == argo.url + "/"  # the gate tags the parent run with the workflow's page
    gate_args = next(t for t in req["workflow"]["spec"]["templates"] if t["name"] == "gate")["container"]["args"]
    assert "{{workflow.parameters.argo-ui}}workflows/{{workflow.namespace}}/{{workflow.name}}" in gate_args
    assert req["workflow"]["metadata"]["namespace"] == "research"


def test_a_host_with_a_path_prefix_keeps_it(argo):
    r = submit("--host", argo.url + "/argo", "--namespace", "perception", "--smoke")
    assert r.returncode == 0, r.stderr
    assert argo.requests[0]["path"] == "/argo/api/v1/workflows/perception"
    assert f"{argo.url}/argo/workflows/perception/" in r.stdout


def test_a_wrong_token_is_refused_with_exit_1(argo):
    r = submit("--host", argo.url, "--namespace", "perception", token="wrong")
    assert r.returncode == 1
    assert argo.requests[0]["auth"] == "Bearer wrong"
    assert "token not valid" in r.stderr or "Unauthorized" in r.stderr


def test_the_token_comes_from_the_environment_only(argo):
    r = submit("--host", argo.url, "--namespace", "perception", token=None)
    assert r.returncode == 2 and "ARGO_TOKEN" in r.stderr
    r = submit("--host", argo.url, "--namespace", "perception", "--token", TOKEN, token=None)
    assert r.returncode == 2  # no such option
    assert argo.requests == []


def test_a_bad_host_is_a_usage_error(argo):
    r = submit("--host", "ftp://argo.example.com", "--namespace", "perception")
    assert r.returncode == 2 and "--host 'ftp://argo.example.com'" in r.stderr and "host:port" in r.stderr
    r = submit("--namespace", "perception")
    assert r.returncode == 2 and "ARGO_SERVER" in r.stderr
    assert argo.requests == []
