"""Seeded synthetic MBP-10 books with signal at two time scales (DESIGN §4).

Latent efficient price p (ticks): dp_t = kappa * I_{t-1} + mu * r_t + sigma * eps_t.
- fast: the order-flow imbalance I_t = tanh(z_t) tilts level-0/1 sizes and pushes the mid; z is
  AR(1) with time constant ~ the shortest horizon, so it predicts the next tens of snapshots.
- slow: a two-state regime r_t = +-1 with mean duration ~3x max(window, longest horizon) drifts
  the mid and shifts z's mean a little. One snapshot hardly shows it; the window's price path and
  its average imbalance do, so only a model that reads the whole window can use it at long horizons.
Worlds with a known answer (`data.synthetic_world`), to measure the gate rather than the model:
- `default`: the books above.
- `no_signal`: the same books, labels from an independent random walk (`independent_labels`): no
  feature predicts them, so no arm can beat AUC 0.5 beyond noise and every ship is a false ship.
- `per_horizon`: the books above plus rare marked events (`HorizonEvents`), built so that the true
  answer to "do per-horizon queries help?" is yes. See "The per_horizon world" below.
- `per_horizon_null`: its null twin. The same books, events, drifts and labels; only the side that
  each event flags is drawn independently of the drift it announces, so no event predicts anything.
- `per_horizon_extremes` / `per_horizon_extremes_null`: the known yes, built against what defeated
  `per_horizon` (below): bursts of look-alike snapshots whose consequences no window that shows them has
  begun to see, the weakest deciding the second-longest horizon and the strongest the longest, and no
  drift besides (perception/data/extremes_world.py); its null twin draws the sides apart from the jumps.
The per_horizon world (`HorizonEvents`). Let K be the window, h_s = horizons[1] and h_max the longest
horizon. Three kinds of rare event mark one snapshot each; every event flags a side s = +-1 the same
way (ten-fold sizes at levels 5-9 on the bid for +1, on the ask for -1), and its kind by eight-fold
order counts on both sides at levels 7-9 (marker a), levels 2-4 (marker b) or both:
- *short* (a): the mid drifts s·r_S per snapshot for U = K + h_s snapshots from the event, so for
  every lag of the event inside a window the horizons up to h_s lie wholly inside its drift, then
  falls back at twice the rate to the rise of the window's mean lag: averaged over the lags at which
  a window shows the event, it moves the mid over the longest horizon by about nothing;
- *long* (b): after a delay of U (so it never reaches the horizons up to h_s of a window that shows
  the event) the mid drifts s·r_L for h_max snapshots;
- *distractor* (a and b): a side and no drift at all.
Events of one kind are spaced more than their drift lasts, so at most one of each kind is in a window
and its drift is the only one of its kind running. The short horizons are decided by the short
event, the longest by the long one, and the distractor decides nothing.
Why one shared query must lose information. The pool's scores are q·k over the window's snapshots.
Where k is linear in the markers (as the book features are), a distractor scores the sum of what a
short and a long event score, less a snapshot without markers: one softmax that weighs both the
short and the long event above the background weighs the distractor above both. And all three kinds
carry their side in the same coordinates, so the pooled context holds a weighted sum of the sides in
which the relevant ones cannot be told apart from the distractor's. A shared query therefore reads at
most one of the two events cleanly (q ~ a - b or q ~ b - a); trained on every horizon's loss it takes
the short event that four horizons need, and the longest horizon (which the gate weighs) loses the
long event. Per-horizon queries need not choose: q_h ~ a - b for the short horizons, b - a for the
longest. An oracle that reads one event's side leaves the other event's horizons near chance, and no
single read serves every horizon (tests/data/test_synthetic.py checks this). The argument holds for keys
that are linear in the markers; a trunk that learns the markers' conjunction, or a recurrence that
carries a side to the window's end, could recover what the pool loses, which is why trained arms are
compared on this world rather than assumed to differ (studies/per_horizon_effect.py). What they
showed, and why the known yes moved to `per_horizon_extremes`: docs/validity.md "The `per_horizon` world".
`per_horizon_null` keeps every event, drift and label of `per_horizon` and redraws only the flagged
sides, independently of the drifts: the books differ only at the flagged levels of the event snapshots,
and an event's side predicts nothing at any horizon.
Books sit on a tick grid with a Markov spread of 1-3 ticks, ten dense levels, lognormal sizes and
order counts. Vectorised: AR(1) recursions run through scipy.signal.lfilter, regimes and spreads
from geometric durations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perception.data.book import NS, Snapshots
from perception.data.dbn_io import F_LAST, N_LEVELS, empty_records
from perception.data.extremes_world import (
    SIDE_FACTOR,
    SIDE_LEVELS,  # every world flags a side alike
    JumpBursts,
    jump_bursts,
)

TICK = 250_000_000  # 0.25 in 1e-9 price units (an index-future tick)
START_NS = 1_704_067_200 * NS  # 2024-01-01 00:00 UTC
BASE_PRICE_TICKS = 20_000.0


@dataclass(frozen=True)
class SignalParams:
    tau_fast: float  # snapshots
    regime_len: float  # mean regime duration, snapshots
    sigma: float = 0.6  # per-snapshot noise of the latent price, ticks
    fast_snr: float = 0.8  # fast drift / noise over the shortest horizon
    slow_snr: float = 1.0  # regime drift / noise over the longest horizon
    imbalance_shift: float = 0.12  # regime's shift of z's mean, in z's std

    @classmethod
    def for_scales(cls, horizons: list[int], window: int) -> "SignalParams":
        return cls(tau_fast=float(max(1, horizons[0])), regime_len=3.0 * max(window, horizons[-1]))


def generate(
    n: int,
    seed: int,
    horizons: list[int],
    window: int,
    snapshot_interval: float = 1.0,
    session: int = 82_800,
    session_gap: float = 3600.0,
    world: str = "default",
) -> Snapshots:
    """n snapshots; every `session` snapshots a `session_gap`-second break ends a segment."""
    rng = np.random.default_rng([seed, 0x5EED])
    prm = SignalParams.for_scales(horizons, window)
    if world in EXTREME_WORLDS:  # the bursts are the only signal: no fast drift, no regime drift
        prm = replace(prm, fast_snr=0.0, slow_snr=0.0)
    h_min, h_max = horizons[0], horizons[-1]

    regime = _two_state_regime(rng, n, prm.regime_len)  # (T,) +-1
    phi = np.exp(-1.0 / prm.tau_fast)
    from scipy.signal import lfilter  # here, not at the top: importing scipy.signal costs every command ~1 s

    z = lfilter([np.sqrt(1 - phi**2)], [1.0, -phi], rng.standard_normal(n))  # AR(1), unit var
    z += prm.imbalance_shift * regime
    imb = np.tanh(0.8 * z)  # (T,) in (-1, 1)

    # kappa: the fast drift accumulated over h_min is fast_snr x the noise over h_min
    gain = prm.tau_fast * (1 - np.exp(-h_min / prm.tau_fast))
    kappa = prm.fast_snr * prm.sigma * np.sqrt(h_min) / (gain * imb.std() + 1e-12)
    mu = prm.slow_snr * prm.sigma / np.sqrt(h_max)
    dp = prm.sigma * rng.standard_normal(n) + mu * regime
    dp[1:] += kappa * imb[:-1]
    events: HorizonEvents | JumpBursts | None = None
    if world in EVENT_WORLDS:
        events = _horizon_events(
            np.random.default_rng([seed, 0xE7E]), n, horizons, window, prm.sigma, null=world == "per_horizon_null"
        )
    elif world in EXTREME_WORLDS:
        events = jump_bursts(
            np.random.default_rng([seed, 0x1B5]),
            n,
            horizons,
            window,
            prm.sigma,
            null=world == "per_horizon_extremes_null",
        )
    if events is not None:
        dp += events.drift
    p = BASE_PRICE_TICKS + np.cumsum(dp)

    spread = _markov_spread(rng, n)  # (T,) ticks in {1, 2, 3}
    bid0 = np.floor(p - spread / 2.0 + 0.5).astype(np.int64)
    lvl = np.arange(N_LEVELS)
    bid_px = (bid0[:, None] - lvl) * TICK
    ask_px = (bid0[:, None] + spread[:, None] + lvl) * TICK

    base = 15.0 + 6.0 * lvl  # deeper levels hold more
    tilt = np.zeros((n, N_LEVELS))
    tilt[:, 0], tilt[:, 1] = imb, 0.5 * imb
    bid_sz = _sizes(rng, base * (1 + tilt))
    ask_sz = _sizes(rng, base * (1 - tilt))
    bid_ct, ask_ct = _counts(rng, bid_sz), _counts(rng, ask_sz)
    if events is not None:
        events.mark(bid_sz, ask_sz, bid_ct, ask_ct)

    tick_idx = np.arange(n, dtype=np.int64)
    gap_ticks = int(round(session_gap / snapshot_interval))
    tick_idx += (tick_idx // session) * gap_ticks
    interval_ns = int(round(snapshot_interval * NS))
    segment = (np.arange(n) // session).astype(np.int32)
    dt = np.full(n, snapshot_interval, np.float32)
    return Snapshots(
        ts=START_NS + tick_idx * interval_ns,
        bid_px=bid_px,
        ask_px=ask_px,
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=bid_ct,
        ask_ct=ask_ct,
        dt=dt,
        segment=segment,
    )


EVENT_WORLDS = ("per_horizon", "per_horizon_null")
EXTREME_WORLDS = ("per_horizon_extremes", "per_horizon_extremes_null")  # perception/data/extremes_world.py
MARKER_LEVELS = {"short": (7, 8, 9), "long": (2, 3, 4), "distractor": (7, 8, 9, 2, 3, 4)}  # order counts,
MARKER_FACTOR = 8  # eight-fold on both sides
SHORT_SNR, LONG_SNR = 1.5, 8.0  # drift over h_s (short) and h_max (long) in units of the noise over it


@dataclass
class HorizonEvents:
    """The per_horizon world's events: the drift of the latent price they announce and, per kind, the
    snapshots they mark with the sides they flag (in the null twin, independent of the drift's sign)."""

    drift: np.ndarray  # (T,) ticks per snapshot
    times: dict[str, np.ndarray]  # kind -> (E,) snapshot indices, increasing
    sides: dict[str, np.ndarray]  # kind -> (E,) +-1, the side each event flags
    drift_signs: dict[str, np.ndarray]  # kind -> (E,) +-1, the sign of the drift it announces (0: none)

    def mark(self, bid_sz, ask_sz, bid_ct, ask_ct) -> None:
        for kind, times in self.times.items():
            side = self.sides[kind]
            for level in SIDE_LEVELS:
                bid_sz[times[side > 0], level] *= SIDE_FACTOR
                ask_sz[times[side < 0], level] *= SIDE_FACTOR
            for level in MARKER_LEVELS[kind]:
                bid_ct[times, level] *= MARKER_FACTOR
                ask_ct[times, level] *= MARKER_FACTOR


def drift_pieces(horizons: list[int], window: int) -> dict[str, list[tuple[int, int, float]]]:
    """kind -> the drift it announces: (start, end, rate multiple) pieces, in snapshots after the event."""
    u = window + horizons[min(1, len(horizons) - 1)]
    fall = int(np.ceil((u - window / 2) / 2))  # at twice the rate, back to the window's mean lag
    return {"short": [(0, u, 1.0), (u, u + fall, -2.0)], "long": [(u, u + horizons[-1], 1.0)], "distractor": []}


def _horizon_events(
    rng: np.random.Generator, n: int, horizons: list[int], window: int, sigma: float, null: bool = False
) -> HorizonEvents:
    pieces = drift_pieces(horizons, window)
    h_s = horizons[min(1, len(horizons) - 1)]
    rates = {
        "short": SHORT_SNR * sigma / np.sqrt(h_s),
        "long": LONG_SNR * sigma / np.sqrt(horizons[-1]),
        "distractor": 0.0,
    }
    reach = max(end for ps in pieces.values() for _, end, _ in ps)
    times, taken = {}, np.zeros(0, np.int64)
    for kind in ("short", "long", "distractor"):
        # spaced beyond the drift (the distractor as the short events), plus a random gap ~ K/2
        least = max([end for _, end, _ in pieces[kind] or pieces["short"]]) + 1
        gaps = least + rng.geometric(2.0 / window, size=int(n / least) + 8)
        t = np.cumsum(gaps) - rng.integers(0, reach)
        t = t[(t >= 0) & (t < n) & ~np.isin(t, taken)]  # one event per snapshot: its markers stay its own
        times[kind], taken = t, np.r_[taken, t]
    drift, sides, signs = np.zeros(n), {}, {}
    for kind, t in times.items():
        s = rng.choice([-1.0, 1.0], size=len(t))
        sign = s if pieces[kind] else np.zeros(len(t))
        step = np.zeros(n + 1)
        for start, end, mult in pieces[kind]:
            np.add.at(step, np.minimum(t + start, n), sign * mult * rates[kind])
            np.add.at(step, np.minimum(t + end, n), -sign * mult * rates[kind])
        drift += np.cumsum(step)[:n]
        signs[kind], sides[kind] = sign, s
    if null:  # the same drifts; the flagged sides drawn apart from them
        side_rng = np.random.default_rng(rng.integers(2**63))
        sides = {k: side_rng.choice([-1.0, 1.0], size=len(t)) for k, t in times.items()}
    return HorizonEvents(drift, times, sides, signs)


def independent_labels(n: int, seed: int, horizons: list[int], mask: np.ndarray) -> np.ndarray:
    """The no_signal world's labels: y_h[t] = W[t+h] > W[t] for a seeded Gaussian random walk W that
    nothing in the books depends on; masked where the real labels are (segment ends)."""
    walk = np.cumsum(np.random.default_rng([seed, 0x0517]).standard_normal(n))
    y = np.zeros((n, len(horizons)), np.uint8)
    for j, h in enumerate(horizons):
        ahead = np.minimum(np.arange(n) + h, n - 1)
        y[:, j] = (walk[ahead] > walk) & mask[:, j]
    return y


def _two_state_regime(rng: np.random.Generator, n: int, mean_len: float) -> np.ndarray:
    n_runs = int(n / mean_len * 2) + 16
    lengths = rng.geometric(1.0 / mean_len, size=n_runs)
    while lengths.sum() < n:
        lengths = np.r_[lengths, rng.geometric(1.0 / mean_len, size=n_runs)]
    signs = np.where(np.arange(len(lengths)) % 2 == 0, 1.0, -1.0) * rng.choice([-1.0, 1.0])
    return np.repeat(signs, lengths)[:n]


def _markov_spread(rng: np.random.Generator, n: int, mean_len: float = 20.0) -> np.ndarray:
    lengths = rng.geometric(1.0 / mean_len, size=int(n / mean_len * 2) + 16)
    while lengths.sum() < n:
        lengths = np.r_[lengths, rng.geometric(1.0 / mean_len, size=len(lengths))]
    values = rng.choice([1, 2, 3], size=len(lengths), p=[0.7, 0.2, 0.1])
    return np.repeat(values, lengths)[:n].astype(np.int64)


def _sizes(rng: np.random.Generator, mean: np.ndarray) -> np.ndarray:
    noise = rng.lognormal(0.0, 0.4, size=mean.shape)
    return np.maximum(1, np.rint(mean * noise)).astype(np.uint32)


def _counts(rng: np.random.Generator, sizes: np.ndarray) -> np.ndarray:
    per_order = rng.uniform(1.5, 4.0, size=sizes.shape)
    return np.maximum(1, np.rint(sizes / per_order)).astype(np.uint32)


def to_records(
    snaps: Snapshots, snapshot_interval: float = 1.0, instrument_id: int = 1, superseded_every: int = 3, seed: int = 0
) -> np.ndarray:
    """MBP-10 records whose snapshots are `snaps`: one F_LAST record per snapshot at a jittered
    time inside its interval, and every `superseded_every`-th interval an earlier complete state
    (different sizes) that the reader must replace by the later one."""
    rng = np.random.default_rng(seed)
    n = len(snaps)
    interval_ns = int(round(snapshot_interval * NS))
    extra = np.arange(0, n, superseded_every) if superseded_every else np.zeros(0, np.int64)
    src = np.sort(np.r_[np.arange(n), extra], kind="stable")  # snapshot index of each record
    is_extra = np.r_[False, src[1:] == src[:-1]]
    is_extra = np.r_[is_extra[1:], False]  # the earlier record of a pair is the superseded one
    rec = empty_records(len(src))
    rec["instrument_id"] = instrument_id
    jitter = rng.integers(interval_ns // 2, interval_ns, size=len(src))
    jitter[is_extra] = rng.integers(1, interval_ns // 2, size=int(is_extra.sum()))
    rec["ts_recv"] = snaps.ts[src] + jitter
    rec["ts_event"] = rec["ts_recv"] - 20_000
    rec["action"] = np.where(rng.random(len(src)) < 0.5, b"A", b"C")
    rec["side"] = np.where(rng.random(len(src)) < 0.5, b"B", b"A")
    rec["flags"] = F_LAST
    rec["sequence"] = np.arange(len(src), dtype=np.uint32)
    for i in range(N_LEVELS):
        rec[f"bid_px_{i:02d}"] = snaps.bid_px[src, i]
        rec[f"ask_px_{i:02d}"] = snaps.ask_px[src, i]
        rec[f"bid_sz_{i:02d}"] = snaps.bid_sz[src, i] + is_extra
        rec[f"ask_sz_{i:02d}"] = snaps.ask_sz[src, i]
        rec[f"bid_ct_{i:02d}"] = snaps.bid_ct[src, i]
        rec[f"ask_ct_{i:02d}"] = snaps.ask_ct[src, i]
    rec["price"] = rec["bid_px_00"]
    rec["size"] = 1
    return rec
