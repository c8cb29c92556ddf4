"""The gate's rule and evidence (DESIGN §7), as pure functions of the checked inputs.

A = shared, B = per_horizon, paired by fold, final-epoch AUC:
  Δ_h = mean_f AUC_B,h,f − mean_f AUC_A,h,f;  W = Σ w_h Δ_h / Σ w_h;  G = mean_{h ∈ shift} Δ_h.
Rule 1 (first): W ≥ min_lift.  Rule 2: G > 0 and G ≥ max(0, −W) (and W ≥ 0 unless shift_allows_loss).
No rule: keep_shared. The first rule that fires decides: with evidence (its lift ≥ noise_floor, or the
block-bootstrap test on its horizons gives one-sided p < alpha) ship_per_horizon, else inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from tqdm import tqdm

from perception.gate import stats
from perception.gate.config import GateConfig
from perception.gate.inputs import VARIANTS, SweepInputs

SLOWDOWN_RISK = 0.20  # DESIGN §7: a > 20 % training slowdown of the per-horizon arm is a risk


@dataclass
class RuleResult:
    name: str  # "rule 1" | "rule 2"
    statement: str
    lift_name: str  # "W" | "G"
    lift: float
    horizons: list[int]
    weights: list[float]  # Stouffer weights of those horizons
    fired: bool
    p_bootstrap: float
    p_delong_thinned: float
    evidence_floor: bool = False
    evidence_test: bool = False


@dataclass
class GateResult:
    decision: str
    rule: Optional[str]  # the rule that fired
    W: float
    G: float
    p: float  # the fired rule's bootstrap p (rule 1's when none fired)
    delta: dict[int, float]  # Δ_h
    reasons: list[str]
    rules: list[RuleResult]
    auc: dict  # per arm: per-fold (F, H), mean (H,), std (H,)
    per_fold: list[dict]  # per (fold, horizon): bootstrap, thinned DeLong, i.i.d. DeLong
    block_len: int
    throughput: dict
    notes: list[str] = field(default_factory=list)


def decide(inputs: SweepInputs, cfg: GateConfig, progress: bool = True) -> GateResult:
    horizons, folds = inputs.horizons, list(range(inputs.n_folds))
    auc = {v: np.stack([inputs.runs[(v, f)].final_auc for f in folds]) for v in VARIANTS}  # (F, H)
    delta_hf = auc[VARIANTS[1]] - auc[VARIANTS[0]]  # (F, H)
    delta = {h: float(d) for h, d in zip(horizons, delta_hf.mean(axis=0))}
    w = np.array([cfg.weights.get(h, 0.0) for h in horizons])
    W = float((w * delta_hf.mean(axis=0)).sum() / w.sum())
    G = float(np.mean([delta[h] for h in cfg.shift_horizons]))

    block_len = stats.block_length(inputs.window, max(horizons), inputs.stride)
    per_fold = _fold_tests(inputs, cfg, block_len, progress)
    notes = [n for row in per_fold for n in row.pop("notes")]

    rule1_h = [h for h in horizons if cfg.weights.get(h, 0.0) > 0]
    rule1 = _rule("rule 1", f"W >= min_lift ({cfg.min_lift:g})", "W", W, rule1_h,
                  [cfg.weights[h] for h in rule1_h], W >= cfg.min_lift, per_fold, cfg)
    rule2_fires = G > 0 and G >= max(0.0, -W) and (cfg.shift_allows_loss or W >= 0)
    rule2_text = "G > 0 and G >= max(0, -W)" + ("" if cfg.shift_allows_loss else " and W >= 0")
    rule2 = _rule("rule 2", rule2_text, "G", G, list(cfg.shift_horizons), [1.0] * len(cfg.shift_horizons),
                  rule2_fires, per_fold, cfg)

    fired = next((r for r in (rule1, rule2) if r.fired), None)
    reasons = [_rule_line(r, cfg) for r in (rule1, rule2)]
    if fired is None:
        decision = "keep_shared"
        reasons.append("no rule fired: keep the shared query")
    else:
        if fired is rule2 and rule1.fired is False:
            reasons.append("rule 1 did not fire, so rule 2 decides")
        elif fired is rule1 and rule2.fired:
            reasons.append("rule 1 fired first; rule 2 also holds but rule 1 decides")
        reasons.append(_evidence_line(fired, cfg))
        decision = "ship_per_horizon" if (fired.evidence_floor or fired.evidence_test) else "inconclusive"
    throughput = _throughput(inputs)
    if throughput.get("slowdown") is not None and throughput["slowdown"] > SLOWDOWN_RISK:
        notes.append(f"risk: {VARIANTS[1]} trains {100 * throughput['slowdown']:.0f}% slower than "
                     f"{VARIANTS[0]} (more than {100 * SLOWDOWN_RISK:.0f}%)")
    p = (fired or rule1).p_bootstrap
    return GateResult(
        decision=decision, rule=fired.name if fired else None, W=W, G=G, p=p, delta=delta,
        reasons=reasons, rules=[rule1, rule2],
        auc={v: {"per_fold": auc[v], "mean": auc[v].mean(axis=0), "std": auc[v].std(axis=0, ddof=1)
                 if len(folds) > 1 else np.zeros(len(horizons))} for v in VARIANTS},
        per_fold=per_fold, block_len=block_len, throughput=throughput, notes=notes,
    )


def _fold_tests(inputs: SweepInputs, cfg: GateConfig, block_len: int, progress: bool) -> list[dict]:
    """Per fold and horizon: the block bootstrap, DeLong on thinned windows, and the i.i.d. DeLong
    on all windows (reported only to show how far it overstates the evidence)."""
    rows = []
    bar = tqdm(range(inputs.n_folds), desc="gate: block bootstrap per fold", unit="fold", disable=not progress)
    for fold in bar:
        pa = inputs.runs[(VARIANTS[0], fold)].predictions
        pb = inputs.runs[(VARIANTS[1], fold)].predictions
        n = len(pa.index)
        notes = []
        if n >= 2 * block_len:
            rng = np.random.default_rng([cfg.seed, fold])  # per fold, so results do not depend on order
            boots = stats.paired_block_bootstrap(pa.probs, pb.probs, pa.labels, pa.mask, block_len,
                                                 cfg.n_bootstrap, rng)
        else:
            boots = [None] * len(inputs.horizons)
            notes.append(f"fold {fold}: {n} windows are fewer than two blocks of {block_len}; "
                         f"no bootstrap evidence from this fold")
        for j, h in enumerate(inputs.horizons):
            valid = pa.mask[:, j]
            y = pa.labels[valid, j]
            a, b, idx = pa.probs[valid, j], pb.probs[valid, j], pa.index[valid]
            kept = stats.thin_by_index(idx, inputs.window + h)
            thin = stats.delong_paired(a[kept], b[kept], y[kept])
            iid = stats.delong_paired(a, b, y)
            boot = boots[j]
            rows.append({
                "fold": fold, "horizon": h, "n_windows": int(valid.sum()),
                "auc_a_predictions": iid.auc_a, "auc_b_predictions": iid.auc_b,
                "bootstrap": None if boot is None else {
                    "delta": boot.delta, "se": boot.se, "z": boot.z, "p": stats.one_sided_p(boot.z),
                    "n_resamples": boot.n_resamples},
                "delong_thinned": {"n": thin.n, "spacing": inputs.window + h, "delta": thin.delta,
                                   "se": thin.se, "z": thin.z, "p": stats.one_sided_p(thin.z)},
                "delong_iid": {"n": iid.n, "delta": iid.delta, "se": iid.se, "z": iid.z,
                               "p": stats.one_sided_p(iid.z)},
                "notes": notes if j == 0 else [],
            })
            metric_gap = max(abs(iid.auc_a - inputs.runs[(VARIANTS[0], fold)].final_auc[j]),
                             abs(iid.auc_b - inputs.runs[(VARIANTS[1], fold)].final_auc[j]))
            if metric_gap > 0.005:
                rows[-1]["notes"].append(f"fold {fold} h{h}: logged val_auc_h{h} differs from the AUC of "
                                         f"{'predictions/val_final.npz'} by {metric_gap:.4f}")
    return rows


def _rule(name, statement, lift_name, lift, horizons, weights, fired, per_fold, cfg) -> RuleResult:
    hw = dict(zip(horizons, weights))
    rows = [r for r in per_fold if r["horizon"] in hw]
    boot_z = [r["bootstrap"]["z"] if r["bootstrap"] else math.nan for r in rows]
    thin_z = [r["delong_thinned"]["z"] for r in rows]
    ws = [hw[r["horizon"]] for r in rows]
    rule = RuleResult(name, statement, lift_name, lift, horizons, weights, bool(fired),
                      stats.one_sided_p(stats.stouffer(np.array(boot_z), np.array(ws))),
                      stats.one_sided_p(stats.stouffer(np.array(thin_z), np.array(ws))))
    rule.evidence_floor = lift >= cfg.noise_floor
    rule.evidence_test = math.isfinite(rule.p_bootstrap) and rule.p_bootstrap < cfg.alpha
    return rule


def _rule_line(r: RuleResult, cfg: GateConfig) -> str:
    hs = ", ".join(f"h{h}" for h in r.horizons)
    return f"{r.name} ({r.statement}) on {hs}: {r.lift_name} = {r.lift:+.4f} -> {'fires' if r.fired else 'does not fire'}"


def _evidence_line(r: RuleResult, cfg: GateConfig) -> str:
    floor = f"{r.lift_name} = {r.lift:+.4f} {'>=' if r.evidence_floor else '<'} noise floor {cfg.noise_floor:g}"
    test = (f"block-bootstrap p = {r.p_bootstrap:.4g} {'<' if r.evidence_test else '>='} alpha {cfg.alpha:g}"
            if math.isfinite(r.p_bootstrap) else "block-bootstrap p unavailable")
    verdict = "evidence" if (r.evidence_floor or r.evidence_test) else "no evidence"
    return f"{verdict} for {r.name}: {floor}; {test} (thinned DeLong p = {r.p_delong_thinned:.4g}, reported only)"


def _throughput(inputs: SweepInputs) -> dict:
    out: dict = {}
    for v in VARIANTS:
        vals = [inputs.runs[(v, f)].samples_per_s for f in range(inputs.n_folds)]
        out[v] = float(np.mean(vals)) if all(x is not None for x in vals) else None
    a, b = out[VARIANTS[0]], out[VARIANTS[1]]
    out["ratio"] = b / a if a and b else None
    out["slowdown"] = 1.0 - out["ratio"] if out["ratio"] is not None else None
    return out
