"""The wiring check: `experiment=smoke` on synthetic books trains both variants without NaN, with a
falling loss and a mean validation AUC of at least 0.51; a per-horizon run warm-starts from the
shared run's checkpoint. Wall time is printed (target under 3 minutes a run on 2 cores)."""

from __future__ import annotations

import json
import math
import time

import pytest

from tests.train.helpers import cli


def _epoch_metrics(run_dir):
    lines = (run_dir / "tracking.jsonl").read_text().splitlines()
    return [e["values"] for e in map(json.loads, lines) if e["op"] == "metrics"]


@pytest.mark.slow(seconds=150)
def test_smoke_both_variants_learn_and_warm_start(perception_home, capsys):
    timings = {}
    for variant in ("shared", "per_horizon"):
        t0 = time.perf_counter()
        res = cli(
            "perception-train",
            "experiment=smoke",
            "sweep_id=smoke",
            f"model.attention_pool={variant}",
            "trainer.progress=false",
            home=perception_home,
            timeout=900,
        )
        timings[variant] = time.perf_counter() - t0
        assert res.returncode == 0, res.stderr[-3000:]
        epochs = _epoch_metrics(perception_home / "runs" / "smoke" / f"{variant}-f0")
        assert all(math.isfinite(v) for e in epochs for v in e.values()), epochs
        assert epochs[-1]["train_loss"] < epochs[0]["train_loss"], [e["train_loss"] for e in epochs]
        assert epochs[-1]["val_auc_mean"] >= 0.51, epochs[-1]

    shared_ckpt = next(
        (perception_home / "runs" / "smoke" / "shared-f0" / "checkpoints").glob("epoch-*/model.safetensors")
    )
    warm = cli(
        "perception-train",
        "experiment=smoke",
        "sweep_id=smoke-warm",
        "model.attention_pool=per_horizon",
        "trainer.epochs=1",
        f"trainer.init_from={shared_ckpt}",
        "trainer.progress=false",
        home=perception_home,
        timeout=900,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "warm start" in warm.stdout
    with capsys.disabled():
        print("\nsmoke wall time on this machine: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
