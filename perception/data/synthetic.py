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
- `per_horizon`: the books above plus two kinds of rare, recognisable events, each announcing a
  drift that starts after a delay, so inside a window only the event itself tells what comes:
  a *fast* event (every ~K/2 snapshots) flags a side with ten-fold size at level 9 and, h_1 snapshots
  later, drifts the mid that way for 2·h_1 snapshots (it decides the short horizons); a *slow* event
  (every ~K) flags a side with eight-fold order counts at level 8 and, K/4 later, drifts the mid for
  h_max snapshots (it decides the long ones). Each drift totals about the noise over its span. The
  short horizons' query should look at the last fast event, the long ones' at the last slow event:
  one shared query has to split its attention between them, per-horizon queries need not. The
  intended gate outcome is `ship_per_horizon` against `shared_skip`. Measured at the `local` scale
  (20 sweeps, README "How far to trust a decision"): no lift, although the queries specialise, since
  about eight slow drifts overlap (only the newest is in the window) and a shared query can attend to
  both event snapshots at once; the expected outcome there is `keep_shared_skip` or `inconclusive`.
Books sit on a tick grid with a Markov spread of 1-3 ticks, ten dense levels, lognormal sizes and
order counts. Vectorised: AR(1) recursions run through scipy.signal.lfilter, regimes and spreads
from geometric durations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perception.data.book import NS, Snapshots
from perception.data.dbn_io import F_LAST, N_LEVELS, empty_records

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


def generate(n: int, seed: int, horizons: list[int], window: int, snapshot_interval: float = 1.0,
             session: int = 82_800, session_gap: float = 3600.0, world: str = "default") -> Snapshots:
    """n snapshots; every `session` snapshots a `session_gap`-second break ends a segment."""
    rng = np.random.default_rng([seed, 0x5EED])
    prm = SignalParams.for_scales(horizons, window)
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
    events = _horizon_events(np.random.default_rng([seed, 0xE7E]), n, horizons, window, prm.sigma) \
        if world == "per_horizon" else None
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
        bid_px=bid_px, ask_px=ask_px,
        bid_sz=bid_sz, ask_sz=ask_sz,
        bid_ct=bid_ct, ask_ct=ask_ct,
        dt=dt, segment=segment,
    )


@dataclass
class HorizonEvents:
    """The per_horizon world's events: their drift of the latent price and where they are marked."""
    drift: np.ndarray  # (T,) ticks per snapshot
    fast: tuple[np.ndarray, np.ndarray]  # (times, signs)
    slow: tuple[np.ndarray, np.ndarray]

    def mark(self, bid_sz, ask_sz, bid_ct, ask_ct) -> None:
        """Fast events: ten-fold size at level 9 on the signed side; slow: eight-fold counts at level 8."""
        for (times, signs), (bid, ask), level, factor in (
                (self.fast, (bid_sz, ask_sz), 9, 10), (self.slow, (bid_ct, ask_ct), 8, 8)):
            up, down = times[signs > 0], times[signs < 0]
            bid[up, level] *= factor
            ask[down, level] *= factor


def _horizon_events(rng: np.random.Generator, n: int, horizons: list[int], window: int,
                    sigma: float) -> HorizonEvents:
    drift = np.zeros(n)
    kinds = []
    # (mean gap, delay, duration): fast events decide h_1's span, slow ones the longest horizon's
    for gap, delay, duration in ((window / 2, horizons[0], 2 * horizons[0]),
                                 (window, max(1, window // 4), horizons[-1])):
        times = np.cumsum(rng.geometric(1.0 / gap, size=int(2 * n / gap) + 8))
        times = times[times < n]
        signs = rng.choice([-1.0, 1.0], size=len(times))
        rate = sigma / np.sqrt(duration)  # the drift totals about the noise over its span
        step = np.zeros(n + 1)
        starts, ends = np.minimum(times + delay, n), np.minimum(times + delay + duration, n)
        np.add.at(step, starts, signs * rate)
        np.add.at(step, ends, -signs * rate)
        drift += np.cumsum(step)[:n]
        kinds.append((times, signs))
    return HorizonEvents(drift, kinds[0], kinds[1])


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


def to_records(snaps: Snapshots, snapshot_interval: float = 1.0, instrument_id: int = 1,
               superseded_every: int = 3, seed: int = 0) -> np.ndarray:
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
