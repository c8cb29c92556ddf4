"""The Argo client's conventions through the installed command: where the server is and how it is
reached (options, else the argo CLI's ARGO_* variables), plain http only when asked for, TLS
verification skipped only with --insecure, no credential printed from an error answer, --dry-run and
validate without a server, --control/--treatment, and README's parameter list."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from perception.sweep.schema import schema_errors

from .argo_eval import substitute
from .fake_argo import reply_json

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cr3t-token-5f1e"


class Server:
    """POST creates a workflow (strict schema checked), GET lists or reads one. `answer`: "ok", or
    "echo-json"/"echo-text" for a 500 whose body echoes the request's headers, as a broken proxy does."""

    def __init__(self, answer: str = "ok", tls: Path | None = None):
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> dict:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                fake.requests.append(
                    {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                return fake.requests[-1]

            def _echo_or_refuse(self) -> bool:
                if answer == "echo-json":
                    reply_json(
                        self,
                        500,
                        {
                            "code": 13,
                            "message": "upstream failed",
                            "request": {"headers": {k: [v] for k, v in self.headers.items()}},
                        },
                    )
                elif answer == "echo-text":
                    text = "upstream failed; request was:\n" + "".join(f"{k}: {v}\n" for k, v in self.headers.items())
                    data = text.encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    reply_json(self, 401, {"code": 16, "message": "token not valid"})
                else:
                    return False
                return True

            def do_POST(self):  # noqa: N802 (http.server's name)
                req = self._record()
                if self._echo_or_refuse():
                    return
                wf = json.loads(req["body"])["workflow"]
                req["workflow"], req["errors"] = wf, schema_errors(wf)
                wf["metadata"]["name"] = wf["metadata"]["generateName"] + "x7k2p"
                reply_json(self, 200 if not req["errors"] else 400, wf)

            def do_GET(self):  # noqa: N802
                self._record()
                if not self._echo_or_refuse():
                    reply_json(self, 200, {"metadata": {}, "items": []})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls / "cert.pem", tls / "key.pem")
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.hostport = f"127.0.0.1:{port}"
        self.url = ("https://" if tls else "http://") + self.hostport
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    started = []

    def start(answer: str = "ok", tls: Path | None = None) -> Server:
        started.append(Server(answer, tls))
        return started[-1]

    yield start
    for s in started:
        s.close()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> Path:
    """A certificate for 127.0.0.1 that no CA signed: what a port-forwarded Argo server presents."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "argo-server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    d = tmp_path_factory.mktemp("tls")
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return d


def sweep(
    *args: str, env: dict[str, str] | None = None, token: str | None = TOKEN, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """The installed command with only the ARGO_* settings given here."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
    if token is not None:
        full["ARGO_TOKEN"] = token
    full.update(env or {})
    return subprocess.run(["perception-sweep", *args], env=full, capture_output=True, text=True, timeout=120, cwd=cwd)


def posted(server: Server) -> list[dict]:
    return [r for r in server.requests if r["method"] == "POST"]


# ---- plain http, asked for; TLS verification, skipped only when asked --------------------------


def test_an_http_host_is_refused_unless_plain_http_is_asked_for(serve):
    s = serve()
    for extra in ([], ["--insecure"], ["-k"]):  # skipping certificate checks is not plain http
        r = sweep("submit", "--smoke", "--host", s.url, *extra)
        assert r.returncode == 2 and "--secure=false" in r.stderr and "unencrypted" in r.stderr, r.stderr
    r = sweep("submit", "--smoke", "--host", s.url, env={"ARGO_INSECURE_SKIP_VERIFY": "true"})
    assert r.returncode == 2 and "ARGO_SECURE=false" in r.stderr
    assert s.requests == []  # refused before anything is sent
    r = sweep("submit", "--smoke", "--host", s.url, "--secure=false")
    assert r.returncode == 0, r.stderr
    assert "warning: plain http" in r.stderr and TOKEN not in r.stderr + r.stdout
    r = sweep("submit", "--smoke", "--host", s.url, env={"ARGO_SECURE": "false"})
    assert r.returncode == 0, r.stderr
    assert [p["auth"] for p in posted(s)] == [f"Bearer {TOKEN}"] * 2 and posted(s)[0]["errors"] == []


def test_contradicting_or_unreadable_tls_settings_are_usage_errors(serve):
    s = serve()
    r = sweep("submit", "--host", "https://argo.example.com", "--secure=false")
    assert r.returncode == 2 and "is https but --secure=false" in r.stderr
    r = sweep("submit", "--host", s.url, env={"ARGO_SECURE": "nope"})
    assert r.returncode == 2 and "ARGO_SECURE=nope" in r.stderr and "expected true or false" in r.stderr
    r = sweep("submit", "--host", s.url, "--secure=true")
    assert r.returncode == 2 and "plain http but --secure=true asks for TLS" in r.stderr
    assert s.requests == []


def test_insecure_skips_certificate_checks_and_nothing_else(serve, self_signed):
    s = serve(tls=self_signed)
    r = sweep("submit", "--smoke", "--host", s.url)
    assert r.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr
    assert s.requests == []  # the handshake failed: no request, no token
    r = sweep("submit", "--smoke", "--host", s.url, "--insecure")
    assert r.returncode == 0, r.stderr
    assert "plain http" not in r.stderr
    # the argo CLI's way: host:port means https, ARGO_INSECURE_SKIP_VERIFY=true skips the check
    r = sweep("submit", "--smoke", env={"ARGO_SERVER": s.hostport, "ARGO_INSECURE_SKIP_VERIFY": "true"})
    assert r.returncode == 0, r.stderr
    assert f"{s.url}/workflows/perception/ab-sweep-smoke-x7k2p" in r.stdout
    assert len(posted(s)) == 2


# ---- the argo CLI's environment ---------------------------------------------------------------


def test_server_namespace_and_token_come_from_the_argo_environment(serve):
    s = serve()
    env = {
        "ARGO_SERVER": s.hostport,
        "ARGO_SECURE": "false",
        "ARGO_NAMESPACE": "research",
        "ARGO_TOKEN": f"Bearer {TOKEN}",
    }  # as `argo auth token` prints it
    r = sweep("submit", "--smoke", env=env, token=None)
    assert r.returncode == 0, r.stderr
    (req,) = posted(s)
    assert req["path"] == "/api/v1/workflows/research" and req["auth"] == f"Bearer {TOKEN}"
    assert req["workflow"]["metadata"]["namespace"] == "research"
    params = {p["name"]: p["value"] for p in req["workflow"]["spec"]["arguments"]["parameters"]}
    assert params["argo-ui"] == s.url + "/"
    # an option beats its variable; ARGO_BASE_HREF puts a server behind a path
    r = sweep("submit", "--smoke", "--namespace", "perception", env={**env, "ARGO_BASE_HREF": "/argo"}, token=None)
    assert r.returncode == 0, r.stderr
    assert posted(s)[1]["path"] == "/argo/api/v1/workflows/perception"
    r = sweep("status", "ab-sweep-x7k2p", env=env, token=None)  # every server command reads them
    assert s.requests[-1]["path"] == "/api/v1/workflows/research/ab-sweep-x7k2p"


# ---- credentials never printed from an answer -------------------------------------------------


@pytest.mark.parametrize("answer", ["echo-json", "echo-text"])
def test_an_error_answer_that_echoes_the_token_is_printed_without_it(serve, answer):
    s = serve(answer)
    for args in (["submit", "--smoke"], ["status", "ab-sweep-x7k2p"], ["logs", "ab-sweep-x7k2p"]):
        r = sweep(*args, "--host", s.url, "--secure=false", env={"ARGO_TOKEN": f"Bearer {TOKEN}"}, token=None)
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "HTTP 500" in out and "upstream failed" in out  # the answer is still shown...
        assert TOKEN not in out and "[redacted]" in out  # ...without the token
        assert "Traceback" not in out
    assert all(req["auth"] == f"Bearer {TOKEN}" for req in s.requests)  # it was sent, and echoed back


def test_redaction_covers_the_forms_a_body_echoes_credentials_in():
    from perception.sweep.redact import redact

    text = (
        'Authorization: Bearer abc.def-123\n{"Authorization": ["Bearer xyz"], "cookie": "sid=42"}\n'
        "password=hunter2&user=me token: t0k3n raw s3cr3t-token-5f1e end; Basic dXNlcjpwYXNz"
    )
    out = redact(text, [f"Bearer {TOKEN}"])
    for secret in ("abc.def-123", "xyz", "sid=42", "hunter2", "t0k3n", TOKEN, "dXNlcjpwYXNz"):
        assert secret not in out, (secret, out)
    assert "user=me" in out and out.count("[redacted]") == 7


# ---- dry run and validate: no server, no token, no test extra -----------------------------------


def test_dry_run_renders_validates_and_prints_the_body_without_a_server_or_token():
    r = sweep("submit", "--dry-run", env={"ARGO_SERVER": "argo.example:2746"}, token=None)  # nothing listens there
    assert r.returncode == 0 and json.loads(r.stdout)["workflow"]["metadata"]["generateName"] == "ab-sweep-", r.stderr
    r = sweep(
        "submit",
        "--dry-run",
        "--sweep-id",
        "sweep-a1",
        "-p",
        "tag=v1.2.0",
        env={"ARGO_SERVER": "argo.example:2746"},
        token=None,
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert schema_errors(body["workflow"]) == []
    params = {p["name"]: p["value"] for p in body["workflow"]["spec"]["arguments"]["parameters"]}
    assert params["tag"] == "v1.2.0" and params["sweep-id"] == "sweep-a1"
    assert params["argo-ui"] == "https://argo.example:2746/"
    assert body["workflow"]["metadata"]["labels"]["perception/sweep-id"] == "sweep-a1"
    assert "would POST https://argo.example:2746/api/v1/workflows/perception; nothing sent" in r.stderr
    r = sweep("submit", "--dry-run", "-p", "data=parquet", token=None)
    assert r.returncode == 2 and "data='parquet'" in r.stderr
    r = sweep("submit", "--dry-run", "--wait", token=None)
    assert r.returncode == 2 and "--dry-run" in r.stderr


def test_validate_checks_a_render_from_outside_the_checkout(tmp_path):
    good, bad = tmp_path / "wf.yaml", tmp_path / "broken.yaml"
    r = sweep("render", "--smoke", "--check", "--out", str(good), cwd=tmp_path)
    assert r.returncode == 0 and "Workflow OK" in r.stderr, r.stderr
    doc = yaml.safe_load(good.read_text())
    doc["spec"]["templates"][0]["container"]["resource"] = {}  # a misspelled field
    bad.write_text(yaml.safe_dump(doc))
    r = sweep("validate", str(good), cwd=tmp_path)  # cwd outside the checkout: no tests/ to import
    assert r.returncode == 0 and f"{good}: Workflow OK" in r.stdout
    r = sweep("validate", str(good), str(bad), cwd=tmp_path)
    assert r.returncode == 1 and f"{bad}: Workflow spec/templates/0/container" in r.stdout and "resource" in r.stdout
    (tmp_path / "cm.yaml").write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    r = sweep("validate", str(tmp_path / "cm.yaml"), cwd=tmp_path)
    assert r.returncode == 1 and "no document of kind Workflow" in r.stdout
    r = sweep("validate", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "missing.yaml: no such file" in r.stderr


# ---- the gate's pair ---------------------------------------------------------------------------


def filled(args: list[str], params: dict[str, str]) -> list[str]:
    """A template's args as Argo fills them in: parameters substituted, expressions evaluated (no sweep-id
    parameter: the workflow's name)."""
    scope = {"workflow.name": "ab-sweep-x7k2p", **{f"workflow.parameters.{k}": v for k, v in params.items()}}
    return [substitute(a, scope) for a in args]


def test_control_and_treatment_reach_prepare_and_are_checked(tmp_path, serve):
    from perception.sweep import cli
    from perception.sweep.design import Design

    out = tmp_path / "wf.yaml"
    r = sweep(
        "render",
        "--arms",
        "shared,per_horizon,shared_skip",
        "--control",
        "shared_skip",
        "--treatment",
        "per_horizon",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    params = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    prepare = next(t for t in doc["spec"]["templates"] if t["name"] == "prepare")["container"]["args"]
    # the pod's command line as Argo fills it in, parsed by the command prepare runs
    args = cli.parser().parse_args(filled(prepare, params))
    assert cli._design(args) == Design(("shared", "per_horizon", "shared_skip"), 1, "shared_skip", "per_horizon")
    # the defaults (empty parameters) are the design's default pair
    default = {p["name"]: p["value"] for p in yaml.safe_load(sweep("render").stdout)["spec"]["arguments"]["parameters"]}
    assert cli._design(cli.parser().parse_args(filled(prepare, default))) == Design()
    r = sweep("render", "--treatment", "shared_skip")
    assert r.returncode == 2 and "--treatment 'shared_skip' is not among the sweep's arms" in r.stderr
    r = sweep("render", "-p", "control=per_horizon", "-p", "treatment=per_horizon")
    assert r.returncode == 2 and "both 'per_horizon'" in r.stderr
    s = serve()
    r = sweep("submit", "--smoke", "--host", s.url, "--secure=false", "--aa", "--control", "per_horizon")
    assert r.returncode == 0, r.stderr
    sent = {p["name"]: p["value"] for p in posted(s)[0]["workflow"]["spec"]["arguments"]["parameters"]}
    assert (sent["aa"], sent["control"], sent["treatment"]) == ("true", "per_horizon", "")


def test_readme_lists_every_workflow_parameter_as_the_definition_has_them():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- workflow-parameters:[^>]*-->\n(.*?)<!-- /workflow-parameters -->", readme, re.S)
    assert block, "README lacks the generated workflow-parameters block"
    r = sweep("render", "--list-parameters")
    assert r.returncode == 0, r.stderr
    assert block.group(1) == r.stdout, (
        "README's parameter table is stale: paste `perception-sweep render --list-parameters` between its markers"
    )
    names = {p["name"] for p in yaml.safe_load(sweep("render").stdout)["spec"]["arguments"]["parameters"]}
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", block.group(1), re.M))
    assert listed == names and {"argo-ui", "calibrate", "control", "treatment"} <= names
