"""What Argo's controller does with the few template forms the workflow uses, written out independently
of the product so tests can run a rendered template's wiring: `{{...}}` substitution, `{{=...}}` expressions
(expr-lang: a ternary, ==, !=, +, asInt; toJson, and jsonpath at an array index `$[N]`) and a task's `when`
(govaluate: bare words are strings, &&, comparisons, integer arithmetic). Anything else raises, so a new
form needs this file extended first."""

from __future__ import annotations

import json
import re
from typing import Mapping

TAG = re.compile(r"\{\{(=?)(.*?)\}\}")
NAME = re.compile(
    r"(workflow\.parameters|inputs\.parameters|tasks\.[a-z0-9-]+\.outputs\.parameters)"
    r'(?:\.([A-Za-z0-9_-]+)|\["([^"]+)"\])|workflow\.name|workflow\.namespace'
)


def substitute(text: str, scope: Mapping[str, str]) -> str:
    """Every tag of `text` filled in from `scope` ("workflow.parameters.NAME", "inputs.parameters.NAME",
    "tasks.T.outputs.parameters.NAME", "workflow.name", "item.KEY"); an unknown name raises KeyError."""

    def one(m: re.Match) -> str:
        return str(_expression(m.group(2), scope)) if m.group(1) else scope[m.group(2).strip()]

    return TAG.sub(one, text)


def _expression(expr: str, scope: Mapping[str, str]):
    def name(m: re.Match) -> str:
        key = m.group(0) if m.group(1) is None else f"{m.group(1)}.{m.group(2) or m.group(3)}"
        return repr(scope[key])

    python = NAME.sub(name, expr)
    ternary = re.fullmatch(r"(.*?)\?(.*?):(.*)", python)
    if ternary:
        python = f"({ternary.group(2)}) if ({ternary.group(1)}) else ({ternary.group(3)})"
    known = {"asInt": int, "toJson": _to_json, "jsonpath": _jsonpath}
    if set(re.findall(r"([A-Za-z_]\w*)\(", python)) - set(known):
        raise ValueError(f"expression {expr!r}: only {sorted(known)} are known here")
    return eval(python, {"__builtins__": {}}, known)  # noqa: S307 (the test's own renders)


def _to_json(value) -> str:
    return json.dumps(value, separators=(",", ":"))  # Go's json.Marshal: no spaces


def _jsonpath(text: str, path: str):
    """Argo's jsonpath(json, path) for the one form used: an array's element `$[N]`, returned as itself."""
    m = re.fullmatch(r"\$\[(\d+)\]", path)
    if not m:
        raise ValueError(f"jsonpath {path!r}: only $[N] is known here")
    return json.loads(text)[int(m.group(1))]


def when(condition: str, scope: Mapping[str, str]) -> bool:
    """A task's `when` after substitution, as govaluate reads it with Argo's bare-words-are-strings rule."""
    result = True
    for clause in substitute(condition, scope).split("&&"):
        m = re.fullmatch(r"\s*(.*?)\s*(==|!=|<=|>=|<|>)\s*(.*?)\s*", clause)
        if not m:
            raise ValueError(f"when {condition!r}: clause {clause!r} is not a comparison")
        left, op, right = (_value(m.group(1)), m.group(2), _value(m.group(3)))
        result = (
            result
            and {
                "==": left == right,
                "!=": left != right,
                "<": left < right,
                ">": left > right,
                "<=": left <= right,
                ">=": left >= right,
            }[op]
        )
    return result


def _value(text: str):
    if re.fullmatch(r"[\d\s+-]+", text):
        return eval(text, {"__builtins__": {}})  # noqa: S307 (digits and + - only)
    return text.strip("'\"")
