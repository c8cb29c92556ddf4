"""Make the git-ignored credential files the kustomization reads, from the committed templates.

    python infra/generate_secrets.py [--dir infra/k8s/base/secrets]

Each `NAME.env.template` becomes `NAME.env` (mode 0600) with every CHANGE_ME replaced by a fresh
random hex token (hex: safe inside the database URIs and the MLflow auth ini). An existing `.env`
is kept as it is: PostgreSQL and MinIO keep the passwords they were first started with, so
rotating them silently would lock the MLflow server out.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path

PLACEHOLDER = "CHANGE_ME"
DEFAULT_DIR = Path(__file__).resolve().parent / "k8s" / "base" / "secrets"


def fill_template(text: str) -> str:
    """Each placeholder gets its own token, so no two credentials are equal."""
    parts = text.split(PLACEHOLDER)
    out = [parts[0]]
    for rest in parts[1:]:
        out += [secrets.token_hex(24), rest]
    return "".join(out)


def write_private(path: Path, text: str) -> None:
    """Temp file in the same directory, 0600 from the start, fsync, rename: never half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate(secrets_dir: Path) -> dict[str, str]:
    """Returns {env file name: "created" | "kept"}."""
    templates = sorted(secrets_dir.glob("*.env.template"))
    if not templates:
        raise SystemExit(f"error: no *.env.template files in {secrets_dir}")
    result = {}
    for template in templates:
        target = template.with_name(template.name.removesuffix(".template"))
        if target.exists():
            result[target.name] = "kept"
            continue
        write_private(target, fill_template(template.read_text()))
        result[target.name] = "created"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="directory of *.env.template files")
    args = parser.parse_args(argv)
    for name, what in generate(args.dir).items():
        print(f"{what:8s} {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
