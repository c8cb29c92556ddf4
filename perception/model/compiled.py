"""The Inductor options of every compiled region of the trunk (model.compile_trunk).

Reproducible across processes: by default Inductor times several tile shapes of each reduction kernel in
every fresh process and keeps the fastest, and tile shapes sum in different orders, so two processes
could train from one seed to different bits. Its deterministic mode builds each reduction with one fixed
configuration and times nothing that changes numerics (no benchmarked matmul padding either); what that
costs and buys: docs/performance.md, benchmarks/determinism.py."""

from __future__ import annotations

from typing import Any, Callable, Union

InductorOption = Union[str, int, bool, Callable[..., Any]]  # the values torch.compile's options take

INDUCTOR_OPTIONS: dict[str, InductorOption] = {"deterministic": True}


def inductor_options(**extra: InductorOption) -> dict[str, InductorOption]:
    """The trunk's options plus a region's own (e.g. shape_padding)."""
    return {**INDUCTOR_OPTIONS, **extra}
