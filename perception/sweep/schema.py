"""The strict Argo Workflows schema check behind `perception-sweep validate` and `submit`, on the
upstream schema shipped in perception/sweep/argo_schema/ (its PROVENANCE.md gives the source and why
each relaxation below is made).

    perception-sweep validate wf.yaml      # exit 1 and the errors when a render does not validate
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent / "argo_schema" / "argo-workflows-v4.1.2.schema.json.gz"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


@functools.lru_cache(maxsize=None)
def strict_validator(kind: str = "Workflow"):
    from jsonschema import Draft202012Validator

    schema = json.loads(gzip.decompress(SCHEMA.read_bytes()))
    definitions = copy.deepcopy(schema["definitions"])
    for d in definitions.values():  # upstream leaves every struct open: close them so typos fail
        if d.get("type") == "object" and "properties" in d and "additionalProperties" not in d:
            d["additionalProperties"] = False
    definitions[INT_OR_STRING] = {"type": ["string", "integer"]}  # the controller accepts both
    definitions[QUANTITY] = {"type": ["string", "number"]}  # cpu: 2
    # One kind as the root (the schema's own root is a oneOf whose errors are unreadable); the
    # definitions stay in the document so "#/definitions/..." references resolve.
    root = {
        "$schema": schema["$schema"],
        "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
        "definitions": definitions,
    }
    Draft202012Validator.check_schema(root)
    return Draft202012Validator(root)


def schema_errors(doc: dict, kind: str = "Workflow") -> list[tuple[str, str]]:
    """(path, message) per violation, sorted by path; empty when the document validates."""
    errors = strict_validator(kind).iter_errors(doc)
    return [
        ("/".join(map(str, e.absolute_path)) or "<root>", e.message)
        for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))
    ]


def file_errors(path: Path) -> list[str]:
    """One line per problem of every document in a rendered YAML file (empty: it validates). A file
    that cannot be read or parsed, or holds no Workflow, is a problem too."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return [f"{path}: cannot read it as YAML: {type(exc).__name__}: {exc}"]
    if not any(isinstance(d, dict) and d.get("kind") == "Workflow" for d in docs):
        return [f"{path}: no document of kind Workflow (a render of `perception-sweep render`)"]
    problems = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or doc.get("kind") not in ("Workflow", "WorkflowTemplate"):
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            problems.append(f"{path}: document {i}: kind {kind!r}, expected Workflow")
            continue
        problems += [
            f"{path}: {doc['kind']} {where}: {message[:300]}" for where, message in schema_errors(doc, doc["kind"])
        ]
    return problems
