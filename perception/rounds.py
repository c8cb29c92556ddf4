"""How a sequential study's waves fill GPU rounds (DESIGN §7), one rule for the local sweep, the workflow
and the report: a wave whose trainings leave GPUs idle in its last round gives them to the next wave's
first trainings, which that wave then need not train; a look reads only its own waves, so this changes
no decision, only the wall time (a three-arm wave of 9 on 6 GPUs: 5 rounds for three looks, not 6)."""

from __future__ import annotations

import math


def idle_lanes(pending: int, lanes: int) -> int:
    """How many lanes the last round of `pending` trainings leaves idle. 0 without lanes (one at a time)."""
    if pending <= 0 or lanes <= 0:
        return 0
    return -pending % lanes


def ahead_counts(per_wave: int, lanes: int, waves: int) -> list[int]:
    """For each wave r, how many of wave r + 1's trainings it trains on its idle lanes (none in the last)."""
    counts, done = [], 0
    for r in range(waves):
        ahead = min(idle_lanes(per_wave - done, lanes), per_wave) if r + 1 < waves else 0
        counts.append(ahead)
        done = ahead
    return counts


def rounds_used(per_wave: int, lanes: int, waves_used: int, max_waves: int) -> int:
    """Rounds on `lanes` GPUs for the first `waves_used` waves of a study of up to `max_waves`, idle lanes
    filled; the trainings a stopping wave ran ahead are counted, they took their rounds."""
    if lanes <= 0:
        raise ValueError(f"lanes={lanes}: expected 1 or more GPUs")
    ahead, rounds, done = ahead_counts(per_wave, lanes, max_waves), 0, 0
    for r in range(waves_used):
        rounds += math.ceil((per_wave - done + ahead[r]) / lanes)
        done = ahead[r]
    return rounds
