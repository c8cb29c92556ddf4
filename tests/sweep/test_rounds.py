"""How a sequential study's waves fill GPU rounds: one rule for the local sweep, the workflow's `ahead`
trainings and the report's cost."""

from __future__ import annotations

import math
import os
import subprocess

import pytest

from perception.rounds import ahead_counts, rounds_used
from perception.sweep.devices import plan_waves


def simulate(per_wave: int, lanes: int, waves_used: int, max_waves: int) -> int:
    """Rounds as the local sweep schedules them: each wave's unfinished trainings, then the next wave's
    first on the last round's idle lanes."""
    rounds, done = 0, 0
    for r in range(waves_used):
        pending = per_wave - done
        fill = min(-pending % lanes, per_wave) if r + 1 < max_waves else 0
        rounds += len(plan_waves(list(range(pending + fill)), [str(g) for g in range(lanes)]))
        done = fill
    return rounds


def test_three_arms_on_six_gpus_take_the_fixed_designs_five_rounds():
    assert ahead_counts(9, 6, 3) == [3, 0, 0]
    assert [rounds_used(9, 6, k, 3) for k in (1, 2, 3)] == [2, 3, 5]
    assert rounds_used(9, 6, 3, 3) == math.ceil(27 / 6)  # the fixed design's
    assert [rounds_used(6, 6, k, 3) for k in (1, 2, 3)] == [1, 2, 3]  # two arms fill six GPUs: nothing to fill


@pytest.mark.parametrize("per_wave", [1, 4, 6, 9, 12, 15])
@pytest.mark.parametrize("lanes", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("max_waves", [1, 2, 3, 5])
def test_the_rule_matches_the_schedule_and_never_costs_a_round(per_wave, lanes, max_waves):
    for k in range(1, max_waves + 1):
        used = rounds_used(per_wave, lanes, k, max_waves)
        assert used == simulate(per_wave, lanes, k, max_waves)
        assert used <= k * math.ceil(per_wave / lanes)  # never later than waves one after another
    assert rounds_used(per_wave, lanes, max_waves, max_waves) >= math.ceil(max_waves * per_wave / lanes)
    assert ahead_counts(per_wave, lanes, max_waves)[-1] == 0  # the last wave trains no wave after it


def test_no_gpus_is_refused():
    with pytest.raises(ValueError, match="lanes=0"):
        rounds_used(9, 0, 1, 3)


def test_prepare_refuses_a_study_without_gpus(tmp_path):
    r = subprocess.run(
        ["perception-sweep", "prepare", "--sweep-id", "s1", "--gpus", "0", "experiment=ci"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PERCEPTION_HOME": str(tmp_path)},
    )
    assert r.returncode == 2 and "--gpus 0: expected the number of GPUs" in r.stderr, r.stderr
    assert not (tmp_path / "runs" / "s1").exists()  # refused before any work
