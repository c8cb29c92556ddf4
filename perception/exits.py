"""How every command ends (DESIGN §7): the one table of exit codes, the gate's word for no decision, and
the one mapping from an error to its exit code and its one-line message.

    perception-train, perception-data, perception-sweep  0 ok, 1 failed work, 2 usage or config error
                                                         (or the sweep or run is held by another process)
    perception-gate                                      0 a decision, 3 refused, 2 usage error
    perception-sweep submit --wait, status               0 a decision, 3 refused, 1 ended without one,
                                                         124 --wait timed out
    perception-train, perception-sweep                   130 interrupted (Ctrl-C), 143 terminated (SIGTERM)
"""

from __future__ import annotations

import signal
import sys
from typing import Mapping, Optional

from perception.errors import ConfigError, PerceptionError
from perception.locks import LockHeld

EXIT_OK = EXIT_DECIDED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_TIMED_OUT = 124
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
REFUSED = "refused"  # the gate's decision file, output and tag when it refuses (exit 3)

# What an error's one-line message starts with; a command may name its own (the gate says "error").
LABELS: Mapping[type, str] = {ConfigError: "config error"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so it records its end (runs KILLED) on the way out."""


def raise_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a repeated SIGTERM must not cut the cleanup short
    raise Terminated(f"signal {signum} (SIGTERM)")


def exit_code(
    exc: PerceptionError | KeyboardInterrupt, prog: str, labels: Optional[Mapping[type, str]] = None, stopped: str = ""
) -> int:
    """The exit code of `prog` ending by `exc`, its reason said on stderr in one line first: a config error
    or a held lock 2, any other PerceptionError 1, SIGTERM 143 and Ctrl-C 130 (followed by `stopped`: what
    becomes of the work)."""
    if isinstance(exc, KeyboardInterrupt):
        terminated = isinstance(exc, Terminated)
        print(
            f"{prog}: {'terminated (SIGTERM)' if terminated else 'interrupted'}" + (f"; {stopped}" if stopped else ""),
            file=sys.stderr,
        )
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    label = next((text for kind, text in {**LABELS, **(labels or {})}.items() if isinstance(exc, kind)), "")
    print(f"{prog}: " + (f"{label}: " if label else "") + str(exc), file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, (ConfigError, LockHeld)) else EXIT_FAILED
