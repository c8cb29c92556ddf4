"""Credentials removed from text a server sent back before it is printed: a proxy or a server error
page may echo the request, its Authorization header included."""

from __future__ import annotations

import re
from typing import Iterable

REDACTED = "[redacted]"
# Authorization: Bearer x / "Authorization": ["Bearer x"] / cookie=x / "token": "x" / password=x ...
_FIELD = re.compile(
    r"""(?ix)
    (\b(?:proxy-)?authorization|\bcookie|\bset-cookie|\bx-api-key|\bapi[-_]?key|\b(?:access[-_]|id[-_]|bearer[-_])?token
       |\bpassword|\bsecret)
    (["']?\s*[:=]\s*\[?\s*["']?)
    ((?:(?:bearer|basic)\s+)?[^\s"',\]}&;]+)"""
)
_SCHEME = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secrets (each, and each without a "Bearer "/"Basic " prefix) and
    without the values of credential-like fields and Authorization schemes."""
    for secret in sorted({s for raw in secrets if raw for s in _forms(raw)}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _FIELD.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return _SCHEME.sub(lambda m: m.group(1) + " " + REDACTED, text)


def _forms(secret: str) -> set[str]:
    secret = secret.strip()
    parts = secret.split(None, 1)
    bare = parts[1] if len(parts) == 2 and parts[0].lower() in ("bearer", "basic") else secret
    return {f for f in (secret, bare) if len(f) >= 4}  # a 1-3 character "secret" would eat the text
