"""The strict Argo Workflows schema check the workflow tests use, on the schema kept in
tests/fixtures/argo (see its PROVENANCE.md for the source and why each relaxation is made).

    python -m tests.sweep.argo wf.yaml      # exit 1 and the errors when a render does not validate
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import sys
from pathlib import Path

from jsonschema import Draft202012Validator

SCHEMA = Path(__file__).resolve().parents[1] / "fixtures" / "argo" / "argo-workflows-v4.1.2.schema.json.gz"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


@functools.lru_cache(maxsize=None)
def strict_validator(kind: str = "Workflow") -> Draft202012Validator:
    schema = json.loads(gzip.decompress(SCHEMA.read_bytes()))
    definitions = copy.deepcopy(schema["definitions"])
    for d in definitions.values():  # upstream leaves every struct open: close them so typos fail
        if d.get("type") == "object" and "properties" in d and "additionalProperties" not in d:
            d["additionalProperties"] = False
    definitions[INT_OR_STRING] = {"type": ["string", "integer"]}  # the controller accepts both
    definitions[QUANTITY] = {"type": ["string", "number"]}  # cpu: 2
    # One kind as the root (the schema's own root is a oneOf whose errors are unreadable); the
    # definitions stay in the document so "#/definitions/..." references resolve.
    root = {"$schema": schema["$schema"], "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
            "definitions": definitions}
    Draft202012Validator.check_schema(root)
    return Draft202012Validator(root)


def schema_errors(doc: dict, kind: str = "Workflow") -> list[tuple[str, str]]:
    """(path, message) per violation, sorted by path; empty when the document validates."""
    errors = strict_validator(kind).iter_errors(doc)
    return [("/".join(map(str, e.absolute_path)) or "<root>", e.message)
            for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))]


def main(paths: list[str]) -> int:
    import yaml

    rc = 0
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc:
                continue
            errs = schema_errors(doc, doc.get("kind", "Workflow"))
            print(f"{path}: {doc.get('kind')} {'OK' if not errs else f'{len(errs)} error(s)'}")
            for where, message in errs:
                print(f"  {where}: {message[:200]}")
            rc |= bool(errs)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
