"""The `per_horizon_jumps` world's events: bursts of look-alike snapshots in two sets, the strongest of
one set deciding the second-longest horizon and the strongest of the other the longest, so that one
shared softmax cannot serve both (a candidate known yes; perception/data/synthetic.py's worlds).

Let K be the window, h_s = horizons[-2] and h_max = horizons[-1]. A *burst* at b is 2m = 6 marked
snapshots at distinct times in [b, b + S), S = max(2m + 2, K // 4), in two look-alike sets of m = 3: the
short set (order counts x 8 at levels 1-2) and the long set (levels 3-4). Every marked snapshot flags a
side s = +-1 (ten-fold sizes at levels 5-9 on the bid for +1, on the ask for -1) and an intensity: order
counts at levels 5-9 times e^i, i = o + 1.2 u with u ~ U(0, 1) per snapshot and an offset o ~ U(0, 2)
per set and burst. K after the burst, when no window that shows its first snapshot is left, the mid
jumps by s_short * J_s (the side of the short set's strongest) and h_s later jumps back; at that moment
it jumps by s_long * J_l for good (the side of the long set's strongest). For a window that holds the
burst at lag tau of its first snapshot from the window's end (S <= tau < K):
- the h_s label sees the excursion from tau = K - h_s on, and never the long jump;
- the h_max label (h_max >= h_s + K - tau) sees the long jump and the excursion cancelled.
Bursts are spaced by more than K + S, so a window holds at most one whole burst; nothing drifts on after
a jump, so a window's price path tells nothing of the next burst's jumps.

Why one shared query must lose information. The pool scores a snapshot by q . k, keys and values the same
layer-normalised trunk states, and averages the values by softmax(score). A score that rises with the
intensity singles out the strongest of a set; the offsets make "strongest" relative, which a softmax is
(it is invariant to a common shift of the scores) and a fixed per-snapshot weighting of the values is not
(layer-normalised values cannot grow as e^i). One softmax singles out one snapshot: the short set's
strongest, the long set's, or the strongest of both; per-horizon queries take the short set's for h_s and
the long set's for h_max. Oracles over 120,000 snapshots at `ci`'s scales (seed 3): the short set's
strongest gives h20 0.721, the long set's h40 0.705; reading the short set leaves h40 at 0.536, the
strongest of both 0.619, a uniform attention with values linear in the intensity 0.627 (the tests check
this at 120,000 snapshots). Trained at `ci` on 60,000 snapshots for 400 steps neither arm learned the
selection (docs/validity.md).

The null twin keeps every burst, time, intensity, jump and label and draws every side apart from the
jumps: the books differ only at the flagged side levels, and no side predicts anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIDE_LEVELS, SIDE_FACTOR = (5, 6, 7, 8, 9), 10  # the side: ten-fold sizes on the flagged side
INTENSITY_LEVELS = (5, 6, 7, 8, 9)  # the intensity: order counts on both sides times e^i
SET_LEVELS, SET_FACTOR = {"short": (1, 2), "long": (3, 4)}, 8  # the set: eight-fold order counts, both sides
PER_SET = 3
OFFSET_RANGE, SPREAD = 2.0, 1.2  # i = U(0, OFFSET_RANGE) per set and burst + SPREAD * U(0, 1)
SHORT_SNR, LONG_SNR = 3.0, 3.0  # jump sizes in units of the noise over h_s and h_max


@dataclass
class JumpBursts:
    """Bursts: per set, its marked snapshots' times, sides and intensities, and the jump it decides."""
    drift: np.ndarray  # (T,) ticks per snapshot: the jumps
    starts: np.ndarray  # (B,) each burst's first snapshot
    times: dict[str, np.ndarray]  # set -> (B, m) snapshot indices
    sides: dict[str, np.ndarray]  # set -> (B, m) +-1
    intensity: dict[str, np.ndarray]  # set -> (B, m)
    signs: dict[str, np.ndarray]  # set -> (B,) +-1, the sign of the jump it decides

    def mark(self, bid_sz, ask_sz, bid_ct, ask_ct) -> None:
        for kind, times in self.times.items():
            t, side = times.ravel(), self.sides[kind].ravel()
            factor = np.exp(self.intensity[kind].ravel())
            for level in SIDE_LEVELS:
                bid_sz[t[side > 0], level] *= SIDE_FACTOR
                ask_sz[t[side < 0], level] *= SIDE_FACTOR
            for level in INTENSITY_LEVELS:
                bid_ct[t, level] = np.rint(bid_ct[t, level] * factor).astype(bid_ct.dtype)
                ask_ct[t, level] = np.rint(ask_ct[t, level] * factor).astype(ask_ct.dtype)
            for level in SET_LEVELS[kind]:
                bid_ct[t, level] *= SET_FACTOR
                ask_ct[t, level] *= SET_FACTOR

    def strongest_sides(self, kind: str) -> np.ndarray:
        """(B,) the side flagged by each burst's strongest snapshot of `kind`."""
        return self.sides[kind][np.arange(len(self.starts)), self.intensity[kind].argmax(axis=1)]


def burst_span(window: int) -> int:
    return max(2 * PER_SET + 2, window // 4)


def jump_bursts(rng: np.random.Generator, n: int, horizons: list[int], window: int, sigma: float,
                null: bool = False) -> JumpBursts:
    span = burst_span(window)
    reach = window + span
    gaps = reach + 1 + rng.geometric(2.0 / window, size=int(n / reach) + 8)
    starts = np.cumsum(gaps) - int(rng.integers(0, reach))
    starts = starts[(starts >= 0) & (starts + span < n)]
    n_bursts = len(starts)
    rows = np.arange(n_bursts)
    offsets = np.sort(np.argsort(rng.random((n_bursts, span)), axis=1)[:, :2 * PER_SET], axis=1)  # distinct
    is_short = np.argsort(rng.random((n_bursts, 2 * PER_SET)), axis=1) < PER_SET
    times, sides, intensity, signs = {}, {}, {}, {}
    for kind, chosen in (("short", is_short), ("long", ~is_short)):
        times[kind] = (starts[:, None] + offsets)[chosen].reshape(n_bursts, PER_SET)
        intensity[kind] = rng.uniform(0, OFFSET_RANGE, size=(n_bursts, 1)) + SPREAD * rng.random((n_bursts, PER_SET))
        sides[kind] = rng.choice([-1.0, 1.0], size=(n_bursts, PER_SET))
        signs[kind] = rng.choice([-1.0, 1.0], size=n_bursts)
        if not null:  # the strongest flags its jump's sign; the others, and every side in the twin, are noise
            sides[kind][rows, intensity[kind].argmax(axis=1)] = signs[kind]

    h_s, h_max = horizons[max(0, len(horizons) - 2)], horizons[-1]
    short_jump, long_jump = SHORT_SNR * sigma * np.sqrt(h_s), LONG_SNR * sigma * np.sqrt(h_max)
    drift = np.zeros(n)
    np.add.at(drift, np.minimum(starts + window, n - 1), signs["short"] * short_jump)  # the excursion,
    np.add.at(drift, np.minimum(starts + window + h_s, n - 1), -signs["short"] * short_jump)  # back,
    np.add.at(drift, np.minimum(starts + window + h_s, n - 1), signs["long"] * long_jump)  # and the long jump
    return JumpBursts(drift, starts, times, sides, intensity, signs)
