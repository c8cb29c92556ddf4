"""Credentials: only templates in git; the generator fills them once and never rotates them."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

from .manifests import INFRA, REPO

TEMPLATES = INFRA / "k8s" / "base" / "secrets"
GENERATOR = INFRA / "generate_secrets.py"


def run_generator(secrets_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), "--dir", str(secrets_dir)], capture_output=True, text=True)


def test_git_holds_templates_only():
    tracked = subprocess.run(
        ["git", "ls-files", "infra"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in tracked if f.endswith(".env")], tracked
    templates = sorted(TEMPLATES.glob("*.env.template"))
    assert {t.name for t in templates} == {
        "mlflow-credentials.env.template",
        "mlflow-db.env.template",
        "minio-credentials.env.template",
    }
    for t in templates:
        assert "CHANGE_ME" in t.read_text(), f"{t} must hold placeholders, not values"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(TEMPLATES / "mlflow-db.env")], cwd=REPO)
    assert ignored.returncode == 0, "a filled-in secrets/*.env would not be ignored by git"


def test_generator_fills_every_placeholder_with_a_distinct_token(tmp_path):
    d = tmp_path / "secrets"
    shutil.copytree(TEMPLATES, d)
    proc = run_generator(d)
    assert proc.returncode == 0, proc.stderr
    values = []
    for env in sorted(d.glob("*.env")):
        text = env.read_text()
        assert "CHANGE_ME" not in text, env
        assert stat.S_IMODE(env.stat().st_mode) == 0o600, env
        pairs = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
        values += [v for k, v in pairs.items() if "PASSWORD" in k]
    assert len(values) == 3 and len(set(values)) == 3
    assert all(len(v) == 48 and int(v, 16) >= 0 for v in values)  # hex: safe in URIs and the ini


def test_generator_keeps_existing_credentials(tmp_path):
    d = tmp_path / "secrets"
    shutil.copytree(TEMPLATES, d)
    (d / "mlflow-db.env").write_text("POSTGRES_USER=mlflow\nPOSTGRES_PASSWORD=already-in-use\nPOSTGRES_DB=mlflow\n")
    proc = run_generator(d)
    assert proc.returncode == 0, proc.stderr
    assert "already-in-use" in (d / "mlflow-db.env").read_text()
    assert "kept" in proc.stdout and "created" in proc.stdout


def test_generator_names_an_empty_directory(tmp_path):
    proc = run_generator(tmp_path)
    assert proc.returncode != 0 and str(tmp_path) in proc.stderr
