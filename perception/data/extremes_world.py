"""The `per_horizon_extremes` world's events: bursts of look-alike snapshots whose weakest decides the
second-longest horizon and whose strongest the longest, so that one softmax weighting cannot serve both
(the known yes; perception/data/synthetic.py's worlds).

Let K be the window, h_s = horizons[-2] and h_max = horizons[-1]. A *burst* at b is m = 4 marked
snapshots at distinct times in [b, b + S), S = max(m + 2, K // 4): eight-fold order counts at levels
1-2 (the marker), a side s = +-1 (ten-fold sizes at levels 5-9 on the bid for +1, on the ask for -1) and
an intensity i = o + SPREAD * u, u ~ U(0, 1) per snapshot and an offset o ~ U(0, OFFSET_RANGE) per
burst, shown exactly: order counts at levels 5-9 set to round(INTENSITY_COUNT * e^i) on both sides.
K after the burst's start b the mid jumps by s_weak * J_s (the side of the weakest) and h_s later jumps
back; at that moment it jumps by s_strong * J_l for good (the side of the strongest). For a window that
holds the burst at lag tau of b from the window's end (S <= tau < K):
- the h_s label sees the excursion from tau = K - h_s on, and never the lasting jump;
- the h_max label sees the lasting jump and the excursion cancelled where tau >= K + h_s - h_max; nearer
  the end (tau < K + h_s - h_max) it ends before the excursion falls back and reads the weakest too;
- the jumps are timed from b, not from the first marked snapshot: a window that holds the burst whole
  while b lies before the window's start already shows the excursion begin; both arms see that alike.
Bursts are spaced by more than K + S, so a window holds at most one whole burst; nothing drifts on after
a jump, so a window's price path tells nothing of the next burst's jumps. In these worlds the base book's
fast and regime drifts are off (perception/data/synthetic.py): the bursts are the only signal.

Why one shared query loses. The pool averages the values (layer-normalised trunk states) by
softmax(q . k). A query whose score rises with the intensity singles out the strongest, one whose score
falls the weakest: with per-horizon queries each horizon takes its own. One softmax weighting gives both
only through its values: they would have to carry the side times e^(-c i) (to bring the weakest back
from under the strongest's weight, or from under a uniform average's), over a range e^(c R) that the
random offset R = OFFSET_RANGE + SPREAD makes wide, in states that also carry the book; a value linear
or polynomial in the intensity is swamped by the offset. The CfC, which every arm runs over the window,
could in principle carry both extremes to its last state, which is why trained arms are compared on this
world rather than assumed to differ. The oracles (each extreme's side over the windows that hold a burst
whole, and the best single softmax weighting) are checked by tests/data/test_synthetic.py; their figures,
the windows' shares above and what trained arms showed: docs/validity.md "The known yes".

The null twin keeps every burst, time, intensity, jump and label and draws every side apart from the
jumps: the books differ only at the flagged side levels, and no side predicts anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIDE_LEVELS, SIDE_FACTOR = (5, 6, 7, 8, 9), 10  # the side: ten-fold sizes on the flagged side
INTENSITY_LEVELS, INTENSITY_COUNT = (5, 6, 7, 8, 9), 16  # the intensity: order counts 16 e^i, both sides
MARKER_LEVELS, MARKER_FACTOR = (1, 2), 8  # a burst's snapshot: eight-fold order counts, both sides
PER_BURST = 4
OFFSET_RANGE, SPREAD = 2.0, 1.6  # i = U(0, OFFSET_RANGE) per burst + SPREAD * U(0, 1) per snapshot
SHORT_SNR, LONG_SNR = 3.0, 3.0  # jump sizes in units of the noise over h_s and h_max


@dataclass
class JumpBursts:
    """Bursts: their marked snapshots' times, sides and intensities, and the jumps they decide."""

    drift: np.ndarray  # (T,) ticks per snapshot: the jumps
    starts: np.ndarray  # (B,) each burst's first snapshot
    times: np.ndarray  # (B, m) snapshot indices, increasing
    sides: np.ndarray  # (B, m) +-1
    intensity: np.ndarray  # (B, m)
    signs: dict[str, np.ndarray]  # "short" | "long" -> (B,) +-1, the sign of the excursion | lasting jump

    def mark(self, bid_sz, ask_sz, bid_ct, ask_ct) -> None:
        t, side = self.times.ravel(), self.sides.ravel()
        count = np.rint(INTENSITY_COUNT * np.exp(self.intensity.ravel())).astype(bid_ct.dtype)
        for level in SIDE_LEVELS:
            bid_sz[t[side > 0], level] *= SIDE_FACTOR
            ask_sz[t[side < 0], level] *= SIDE_FACTOR
        for level in INTENSITY_LEVELS:
            bid_ct[t, level] = count
            ask_ct[t, level] = count
        for level in MARKER_LEVELS:
            bid_ct[t, level] *= MARKER_FACTOR
            ask_ct[t, level] *= MARKER_FACTOR

    def extreme_sides(self, which: str) -> np.ndarray:
        """(B,) the side flagged by each burst's weakest ("short") or strongest ("long") snapshot."""
        pick = self.intensity.argmin(axis=1) if which == "short" else self.intensity.argmax(axis=1)
        return self.sides[np.arange(len(self.starts)), pick]


def burst_span(window: int) -> int:
    return max(PER_BURST + 2, window // 4)


def jump_bursts(
    rng: np.random.Generator, n: int, horizons: list[int], window: int, sigma: float, null: bool = False
) -> JumpBursts:
    span = burst_span(window)
    reach = window + span
    gaps = reach + 1 + rng.geometric(2.0 / window, size=int(n / reach) + 8)
    starts = np.cumsum(gaps) - int(rng.integers(0, reach))
    starts = starts[(starts >= 0) & (starts + span < n)]
    n_bursts = len(starts)
    rows = np.arange(n_bursts)
    offsets = np.sort(np.argsort(rng.random((n_bursts, span)), axis=1)[:, :PER_BURST], axis=1)  # distinct
    times = starts[:, None] + offsets
    intensity = rng.uniform(0, OFFSET_RANGE, size=(n_bursts, 1)) + SPREAD * rng.random((n_bursts, PER_BURST))
    sides = rng.choice([-1.0, 1.0], size=(n_bursts, PER_BURST))
    signs = {kind: rng.choice([-1.0, 1.0], size=n_bursts) for kind in ("short", "long")}
    if not null:  # the weakest flags the excursion, the strongest the lasting jump; the rest are noise
        sides[rows, intensity.argmin(axis=1)] = signs["short"]
        sides[rows, intensity.argmax(axis=1)] = signs["long"]

    h_s, h_max = horizons[max(0, len(horizons) - 2)], horizons[-1]
    short_jump, long_jump = SHORT_SNR * sigma * np.sqrt(h_s), LONG_SNR * sigma * np.sqrt(h_max)
    drift = np.zeros(n)
    np.add.at(drift, np.minimum(starts + window, n - 1), signs["short"] * short_jump)  # the excursion,
    np.add.at(drift, np.minimum(starts + window + h_s, n - 1), -signs["short"] * short_jump)  # back,
    np.add.at(drift, np.minimum(starts + window + h_s, n - 1), signs["long"] * long_jump)  # and the lasting jump
    return JumpBursts(drift, starts, times, sides, intensity, signs)
