"""The gate's rule and evidence (DESIGN §7), as pure functions of the checked inputs.

A comparison of arm A (control) with arm B (treatment), paired by fold and replicate, final-epoch AUC:
  Δ_h = mean_{f,r} (AUC_B,h,f,r − AUC_A,h,f,r);  W = Σ w_h Δ_h / Σ w_h;  G = mean_{h ∈ shift} Δ_h.
Rule 1 (first): W ≥ min_lift.  Rule 2: G > 0 and G ≥ max(0, −W) (and W ≥ 0 unless shift_allows_loss).
No rule: keep_<A>. The first rule that fires decides: with evidence ship_<B>, else inconclusive.

Evidence for a rule's lift L (W or G, a weighted mean of Δ_h over the rule's horizons), with F folds
and R replicates per fold, one of three:
  - R ≥ 2: se² = se²_windows + se²_training. se²_training = s²/(F·R), s² the between-replicate
    variance of a cell's lift pooled over folds (F·(R−1) degrees of freedom): it holds training noise
    and each replicate's own prediction noise on the fold's windows. se²_windows is the paired
    moving-block bootstrap (the same blocks for every run of a fold) of what the fold's replicates
    share: the bootstrap variance of the replicate-mean lift less its replicate-specific part
    (Σ_r var*(L*_r − L̄*)/(R−1), divided by R), so prediction noise is not counted twice; folds
    independent: se²_windows = Σ_f v_f / F².
  - R = 1 with an A/A measurement for this experiment (perception/gate/noise.py: PERCEPTION_HOME's
    noise folder first, then the shipped files; the file named): se²_windows the fold's bootstrap,
    se²_training = s²_A/A / F (the file's cells as df).
  - R = 1 without one: se² = the between-fold variance of the per-fold lift / F with F − 1 degrees
    of freedom. A fold's lift varies with its windows, its trained models and the fold itself, so
    this covers training noise with no replicate; with F = 3 it is a weak test, and the report names
    the commands that make it stronger.
  t = L / se, one-sided p = P(T_ν ≥ t) with Satterthwaite's degrees of freedom
  ν = se⁴ / (se⁴_training / ν_training) (the window bootstrap's variance counts as known).
  The first two assume a fold's lift varies only through its windows and its trainings; a difference
  between the arms that changes from fold to fold is in neither. So the folds' agreement is tested (the
  fold lifts' spread² / F against se², an F ratio on F − 1 and ν df); where it rejects at HETEROGENEITY_P
  the se is the fold lifts' spread / √F with F − 1 df.
One α over every route to a ship (perception/gate/evidence.py): Holm's step-down over the two rules'
tests, so a rule's test is at α/2, or at α once the other rule's test is rejected at α/2. Evidence
for the rule that decides: p < its Holm level, or the noise floor: the lift's lower confidence bound
L − t_{ν,1−level}·se ≥ noise_floor (with a floor ≥ 0 that implies the test, so the floor opens no
route of its own). Each rule's minimum detectable effect is the true lift it would ship 8 times in 10
at level α/2 (the other rule silent), from its own se, ν and threshold, with se read as the estimate it
is (median-unbiased: perception/gate/evidence.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.stats import chi2
from scipy.stats import f as f_dist
from scipy.stats import t as student_t
from tqdm import tqdm

from perception.gate import stats
from perception.gate.config import GateConfig
from perception.gate.evidence import MULTIPLICITY, holm_levels, minimum_detectable, t_quantile
from perception.gate.inputs import SweepInputs
from perception.gate.noise import TrainingNoise

HETEROGENEITY_P = 0.10  # an F ratio on 2 df has little power: test the folds' agreement loosely
SLOWDOWN_RISK = 0.20  # DESIGN §7: a > 20 % training slowdown of the treatment arm is a risk


@dataclass
class RuleResult:
    name: str  # "rule 1" | "rule 2"
    statement: str
    lift_name: str  # "W" | "G"
    lift: float
    horizons: list[int]
    weights: list[float]
    fired: bool
    p_bootstrap: float  # the rule's test: windows and, where covered, training noise
    p_delong_thinned: float  # reported only
    se: float = math.nan
    se_windows: float = math.nan
    se_training: float = 0.0
    df: float = math.inf  # Satterthwaite's degrees of freedom of se
    variance: str = ""  # where se comes from: "windows + replicates" | "windows + A/A file" | "between folds"
    level: float = math.nan  # the test's Holm level: alpha / 2, or alpha once the other rule's test rejects
    lower_bound: float = math.nan  # L − t_{df,1−level}·se
    evidence_floor: bool = False
    evidence_test: bool = False
    mde: float = math.nan  # the true lift this rule would ship with probability 0.8 (level alpha / 2)
    heterogeneity_p: float = math.nan  # the fold lifts' spread against se: an F ratio's p (NaN: not run)
    fold_spread: bool = False  # the folds disagreed, and se is their lifts' spread (F − 1 df)


@dataclass
class Resamples:
    """Per fold: the observed and block-resampled AUC of every loaded run, per horizon."""

    observed: dict[tuple[str, int, int], np.ndarray]  # (arm, fold, replicate) -> (H,)
    resampled: dict[tuple[str, int, int], np.ndarray]  # -> (n_boot, H), NaN where a class is empty
    block_len: int
    notes: list[str]


@dataclass
class GateResult:
    control: str
    treatment: str
    decision: str
    rule: Optional[str]  # the rule that fired
    W: float
    G: float
    p: float  # the fired rule's p (rule 1's when none fired)
    delta: dict[int, float]  # Δ_h
    reasons: list[str]
    rules: list[RuleResult]
    auc: dict  # per arm: per-fold (F, H) replicate means, mean (H,), std (H,)
    per_fold: list[dict]  # per (fold, horizon): bootstrap of the replicate-mean Δ, thinned and i.i.d. DeLong
    block_len: int
    throughput: dict
    replicates: int
    training_noise: str  # how training noise enters the evidence, in words
    notes: list[str] = field(default_factory=list)
    multiplicity: str = MULTIPLICITY
    se_by_horizon: dict[int, float] = field(default_factory=dict)  # se of Δ_h, by the rules' own recipe

    @property
    def mde(self) -> dict[str, float]:
        """{"W": rule 1's minimum detectable effect, "G": rule 2's}."""
        return {r.lift_name: r.mde for r in self.rules}


def resample(inputs: SweepInputs, cfg: GateConfig, progress: bool = True) -> Resamples:
    """Block-resamples every fold once; every comparison of the sweep reuses the draws."""
    block_len = stats.block_length(inputs.window, max(inputs.horizons), inputs.stride)
    observed, resampled, notes = {}, {}, []
    bar = tqdm(range(inputs.n_folds), desc="gate: block bootstrap per fold", unit="fold", disable=not progress)
    for fold in bar:
        keys = [k for k in sorted(inputs.runs) if k[1] == fold]
        first = inputs.runs[keys[0]].predictions
        n = len(first.index)
        rng = np.random.default_rng([cfg.seed, fold])  # per fold, so results do not depend on order
        if n < 2 * block_len:
            notes.append(
                f"fold {fold}: {n} windows are fewer than two blocks of {block_len}; "
                f"no bootstrap evidence from this fold"
            )
        scores = {k: inputs.runs[k].predictions.probs for k in keys}
        boot = stats.block_bootstrap_aucs(
            scores, first.labels, first.mask, block_len, cfg.n_bootstrap, rng, enough=n >= 2 * block_len
        )
        for k in keys:
            observed[k], resampled[k] = boot[k]
    return Resamples(observed, resampled, block_len, notes)


def decide(
    inputs: SweepInputs,
    cfg: GateConfig,
    control: str,
    treatment: str,
    boot: Resamples,
    noise: Optional[TrainingNoise] = None,
) -> GateResult:
    horizons, folds, reps = inputs.horizons, range(inputs.n_folds), inputs.replicates
    final = {
        arm: np.stack([[inputs.run(arm, f, r).final_auc for r in reps] for f in folds]) for arm in (control, treatment)
    }
    cells = final[treatment] - final[control]  # (F, R, H)
    delta_h = cells.mean(axis=(0, 1))
    delta = {h: float(d) for h, d in zip(horizons, delta_h)}
    w = np.array([cfg.weights.get(h, 0.0) for h in horizons])
    W = float((w * delta_h).sum() / w.sum())
    G = float(np.mean([delta[h] for h in cfg.shift_horizons]))
    experiment = inputs.run(control, 0, reps[0]).params.get("experiment") or "<experiment>"
    noise_words = _noise_words(len(reps), noise, experiment)
    thinned = _thinned(inputs, control, treatment)  # shared by both rules and the per-fold rows

    def evidenced(
        name: str, statement: str, lift_name: str, lift: float, on: list[int], weights: list[float], fired: bool
    ) -> RuleResult:
        """A rule on these horizons with these weights, its evidence filled in from this sweep."""
        rule = RuleResult(name, statement, lift_name, lift, on, weights, fired, math.nan, math.nan)
        return _rule(rule, inputs, control, treatment, boot, cells, noise, thinned)

    rule1_h = [h for h in horizons if cfg.weights.get(h, 0.0) > 0]
    rule1 = evidenced(
        "rule 1",
        f"W >= min_lift ({cfg.min_lift:g})",
        "W",
        W,
        rule1_h,
        [cfg.weights[h] for h in rule1_h],
        W >= cfg.min_lift,
    )
    rule2_fires = G > 0 and G >= max(0.0, -W) and (cfg.shift_allows_loss or W >= 0)
    rule2_text = "G > 0 and G >= max(0, -W)" + ("" if cfg.shift_allows_loss else " and W >= 0")
    shift = list(cfg.shift_horizons)
    rule2 = evidenced("rule 2", rule2_text, "G", G, shift, [1.0] * len(shift), rule2_fires)
    for r, level, threshold in zip(
        (rule1, rule2), holm_levels(rule1.p_bootstrap, rule2.p_bootstrap, cfg.alpha), (cfg.min_lift, 0.0)
    ):
        conclude(r, level, cfg.noise_floor)
        r.mde = minimum_detectable(r.se, r.df, cfg.alpha / 2, threshold)

    se_by_horizon = {h: evidenced(f"h{h}", "", f"Δ_h{h}", delta[h], [h], [1.0], False).se for h in horizons}

    fired = next((r for r in (rule1, rule2) if r.fired), None)
    reasons = [_rule_line(r) for r in (rule1, rule2)]
    if fired is None:
        decision = f"keep_{control}"
        reasons.append(f"no rule fired: keep {control}")
    else:
        if fired is rule2 and not rule1.fired:
            reasons.append("rule 1 did not fire, so rule 2 decides")
        elif fired is rule1 and rule2.fired:
            reasons.append("rule 1 fired first; rule 2 also holds but rule 1 decides")
        reasons.append(_evidence_line(fired, cfg, noise_words))
        decision = f"ship_{treatment}" if (fired.evidence_floor or fired.evidence_test) else "inconclusive"

    per_fold = _fold_rows(inputs, control, treatment, boot, thinned)
    notes = [n for row in per_fold for n in row.pop("notes")]
    throughput = _throughput(inputs, control, treatment)
    if throughput.get("slowdown") is not None and throughput["slowdown"] > SLOWDOWN_RISK:
        notes.append(
            f"risk: {treatment} trains {100 * throughput['slowdown']:.0f}% slower than "
            f"{control} (more than {100 * SLOWDOWN_RISK:.0f}%)"
        )
    auc = {}
    for arm in (control, treatment):
        per_fold_mean = final[arm].mean(axis=1)  # (F, H)
        auc[arm] = {
            "per_fold": per_fold_mean,
            "mean": per_fold_mean.mean(axis=0),
            "std": per_fold_mean.std(axis=0, ddof=1) if inputs.n_folds > 1 else np.zeros(len(horizons)),
        }
    return GateResult(
        control=control,
        treatment=treatment,
        decision=decision,
        rule=fired.name if fired else None,
        W=W,
        G=G,
        p=(fired or rule1).p_bootstrap,
        delta=delta,
        reasons=reasons,
        rules=[rule1, rule2],
        auc=auc,
        per_fold=per_fold,
        block_len=boot.block_len,
        throughput=throughput,
        replicates=len(reps),
        training_noise=noise_words,
        notes=notes,
        se_by_horizon=se_by_horizon,
    )


def _rule(
    rule: RuleResult,
    inputs: SweepInputs,
    a: str,
    b: str,
    boot: Resamples,
    cells: np.ndarray,
    noise: Optional[TrainingNoise],
    thinned: dict,
) -> RuleResult:
    """Fills the rule's evidence: se from windows and training noise, its degrees of freedom and p."""
    hw = dict(zip(rule.horizons, rule.weights))
    w = np.array([hw.get(h, 0.0) for h in inputs.horizons])
    w = w / w.sum()
    F, R = cells.shape[0], cells.shape[1]
    cell_lift = cells @ w  # (F, R)
    shared_var = _windows_variance(inputs, a, b, boot, w)  # (F,) NaN where a fold has no bootstrap evidence
    rule.se_windows = math.sqrt(float(shared_var.sum())) / F if np.isfinite(shared_var).all() else math.nan
    if R >= 2:
        s2, df_training = float(np.mean(cell_lift.var(axis=1, ddof=1))), F * (R - 1)  # pooled over folds
        rule.variance = "windows + replicates"
    elif noise is not None:
        s2, df_training = noise.cell_variance(w)
        rule.variance = "windows + A/A file"
    else:
        s2, df_training = math.nan, F - 1
        rule.variance = "between folds"
    if rule.variance == "between folds":  # the per-fold lifts' own spread holds every noise at once
        rule.se_training = math.nan
        rule.se = math.sqrt(float(cell_lift[:, 0].var(ddof=1)) / F) if F >= 2 else math.nan
        rule.df = float(df_training) if F >= 2 else math.inf
    else:
        rule.se_training = math.sqrt(s2 / (F * R))
        rule.se = math.sqrt(rule.se_windows**2 + rule.se_training**2) if math.isfinite(rule.se_windows) else math.nan
        rule.df = satterthwaite_df(rule.se, rule.se_training, df_training)
        _guard_heterogeneity(rule, cell_lift.mean(axis=1))
    rule.p_bootstrap = one_sided_p_t(stats.z_score(rule.lift, rule.se), rule.df)
    rows = [(h, t.z) for (_, h), t in thinned.items() if h in hw]
    rule.p_delong_thinned = stats.one_sided_p(
        stats.stouffer(np.array([z for _, z in rows]), np.array([hw[h] for h, _ in rows]))
    )
    return rule


def _guard_heterogeneity(rule: RuleResult, fold_lift: np.ndarray) -> None:
    """The folds' lifts may differ by more than their windows and trainings explain: a difference between
    the arms that changes from fold to fold and that no replicate changes, which the pooled se leaves out.
    The fold lifts' own spread (var / F, F − 1 df) against the pooled se² (its Satterthwaite df) is an F
    ratio; where it rejects at HETEROGENEITY_P, the se is the spread with F − 1 df (Knapp–Hartung's
    random-effects variance with equal weights), which holds that difference."""
    F = len(fold_lift)
    if F < 2 or not (math.isfinite(rule.se) and rule.se > 0) or not np.isfinite(fold_lift).all():
        return
    spread = math.sqrt(float(fold_lift.var(ddof=1)) / F)
    ratio = (spread / rule.se) ** 2
    rule.heterogeneity_p = float(
        f_dist.sf(ratio, F - 1, rule.df) if math.isfinite(rule.df) else chi2.sf(ratio * (F - 1), F - 1)
    )
    if rule.heterogeneity_p < HETEROGENEITY_P and spread > rule.se:
        rule.se, rule.df, rule.fold_spread = spread, float(F - 1), True


def _windows_variance(inputs: SweepInputs, a: str, b: str, boot: Resamples, w: np.ndarray) -> np.ndarray:
    """Per fold, the block bootstrap's variance of what the fold's replicates share: the variance of
    the replicate-mean lift less its replicate-specific part, which the between-replicate variance
    already holds. (F,), NaN for a fold without bootstrap evidence."""
    out = []
    R = len(inputs.replicates)
    for f in range(inputs.n_folds):
        lifts = np.stack(
            [(boot.resampled[(b, f, r)] - boot.resampled[(a, f, r)]) @ w for r in inputs.replicates], axis=1
        )  # (n_boot, R)
        lifts = lifts[np.isfinite(lifts).all(axis=1)]
        if len(lifts) < 2:
            out.append(math.nan)
            continue
        mean_var = float(lifts.mean(axis=1).var(ddof=1))
        if R >= 2:
            specific = float((lifts - lifts.mean(axis=1, keepdims=True)).var(axis=0, ddof=1).sum()) / (R - 1)
            mean_var = max(mean_var - specific / R, 0.0)
        out.append(mean_var)
    return np.asarray(out)


def conclude(rule: RuleResult, level: float, noise_floor: float) -> None:
    """The test and the noise floor at the rule's Holm level."""
    rule.level = level
    rule.evidence_test = math.isfinite(rule.p_bootstrap) and rule.p_bootstrap < level
    rule.lower_bound = rule.lift - t_quantile(level, rule.df) * rule.se if math.isfinite(rule.se) else math.nan
    rule.evidence_floor = bool(math.isfinite(rule.lower_bound) and rule.lower_bound >= noise_floor)


def satterthwaite_df(se: float, se_training: float, df_training: float) -> float:
    """Degrees of freedom of se² = se²_windows + se²_training when only the training part is
    estimated from few cells (Welch–Satterthwaite with the window part's df taken as infinite)."""
    if not (math.isfinite(se) and se > 0 and se_training > 0 and math.isfinite(df_training)):
        return math.inf
    return float(se**4 / (se_training**4 / df_training))


def one_sided_p_t(t: float, df: float) -> float:
    """P(T_df ≥ t); the normal's where df is infinite; NaN stays NaN."""
    if math.isnan(t):
        return math.nan
    return float(student_t.sf(t, df)) if math.isfinite(df) else stats.one_sided_p(t)


def _thinned(inputs: SweepInputs, a: str, b: str) -> dict[tuple[int, int], stats.PairedTest]:
    """(fold, horizon) -> DeLong on windows thinned to one per K + h snapshots, replicate 0."""
    out = {}
    r0 = inputs.replicates[0]
    for fold in range(inputs.n_folds):
        pa, pb = inputs.run(a, fold, r0).predictions, inputs.run(b, fold, r0).predictions
        for j, h in enumerate(inputs.horizons):
            valid = pa.mask[:, j]
            kept = stats.thin_by_index(pa.index[valid], inputs.window + h)
            out[(fold, h)] = stats.delong_paired(
                pa.probs[valid, j][kept], pb.probs[valid, j][kept], pa.labels[valid, j][kept]
            )
    return out


def _fold_rows(inputs: SweepInputs, a: str, b: str, boot: Resamples, thinned: dict) -> list[dict]:
    """Per fold and horizon: the replicate-mean Δ of the predictions with its window bootstrap, the
    thinned DeLong and the i.i.d. DeLong on all windows (only to show how far it overstates)."""
    rows = []
    r0 = inputs.replicates[0]
    for fold in range(inputs.n_folds):
        pa, pb = inputs.run(a, fold, r0).predictions, inputs.run(b, fold, r0).predictions
        d_boot = np.mean(
            [boot.resampled[(b, fold, r)] - boot.resampled[(a, fold, r)] for r in inputs.replicates], axis=0
        )
        d_obs = np.mean([boot.observed[(b, fold, r)] - boot.observed[(a, fold, r)] for r in inputs.replicates], axis=0)
        notes = [n for n in boot.notes if n.startswith(f"fold {fold}:")]
        for j, h in enumerate(inputs.horizons):
            valid = pa.mask[:, j]
            iid = stats.delong_paired(pa.probs[valid, j], pb.probs[valid, j], pa.labels[valid, j])
            thin = thinned[(fold, h)]
            d = d_boot[:, j][np.isfinite(d_boot[:, j])]
            se = float(d.std(ddof=1)) if len(d) > 1 else math.nan
            z = stats.z_score(float(d_obs[j]), se)
            rows.append(
                {
                    "fold": fold,
                    "horizon": h,
                    "n_windows": int(valid.sum()),
                    "auc_a_predictions": iid.auc_a,
                    "auc_b_predictions": iid.auc_b,
                    "bootstrap": None
                    if not math.isfinite(se)
                    else {
                        "delta": float(d_obs[j]),
                        "se": se,
                        "z": z,
                        "p": stats.one_sided_p(z),
                        "n_resamples": int(len(d)),
                    },
                    "delong_thinned": {
                        "n": thin.n,
                        "spacing": inputs.window + h,
                        "delta": thin.delta,
                        "se": thin.se,
                        "z": thin.z,
                        "p": stats.one_sided_p(thin.z),
                    },
                    "delong_iid": {
                        "n": iid.n,
                        "delta": iid.delta,
                        "se": iid.se,
                        "z": iid.z,
                        "p": stats.one_sided_p(iid.z),
                    },
                    "notes": notes if j == 0 else [],
                }
            )
    return rows


def _noise_words(replicates: int, noise: Optional[TrainingNoise], experiment: str) -> str:
    if replicates >= 2:
        return (
            f"training noise from {replicates} replicates per fold (between-replicate variance of the "
            f"lift, pooled over folds, beside the windows' variance of what replicates share)"
        )
    if noise is not None:
        return (
            f"training noise from the A/A measurement {noise.source} "
            f"({', '.join(f'{a}: {n} cells' for a, n in noise.n_cells.items())})"
        )
    return (
        "training noise from the folds alone: one replicate and no A/A measurement for this experiment, "
        "so the evidence is the between-fold variance of the per-fold lift (F - 1 degrees of freedom), "
        "a weak test; for a stronger one run --replicates 2 or more, or measure this experiment's "
        f"training noise once with perception-sweep calibrate --experiment {experiment} --sweeps 5"
    )


def _rule_line(r: RuleResult) -> str:
    hs = ", ".join(f"h{h}" for h in r.horizons)
    return (
        f"{r.name} ({r.statement}) on {hs}: {r.lift_name} = {r.lift:+.4f} -> {'fires' if r.fired else 'does not fire'}"
    )


def _evidence_line(r: RuleResult, cfg: GateConfig, noise_words: str) -> str:
    floor = (
        f"lower bound {r.lower_bound:+.4f} {'>=' if r.evidence_floor else '<'} noise floor {cfg.noise_floor:g}"
        if math.isfinite(r.lower_bound)
        else "no lower bound"
    )
    parts = (
        f"windows {r.se_windows:.4f}, training {r.se_training:.4f}"
        if r.variance != "between folds"
        else "between folds"
    )
    if r.fold_spread:
        parts = f"the folds' spread: they disagree more than windows and training explain, p = {r.heterogeneity_p:.2g}"
    test = (
        f"p = {r.p_bootstrap:.4g} {'<' if r.evidence_test else '>='} Holm level {r.level:g} of alpha "
        f"{cfg.alpha:g} (se {r.se:.4f}: {parts}" + (f"; t with {r.df:.1f} df" if math.isfinite(r.df) else "") + ")"
        if math.isfinite(r.p_bootstrap)
        else "p unavailable"
    )
    verdict = "evidence" if (r.evidence_floor or r.evidence_test) else "no evidence"
    return (
        f"{verdict} for {r.name}: {floor}; {test}; {noise_words} "
        f"(thinned DeLong p = {r.p_delong_thinned:.4g}, reported only)"
    )


def _throughput(inputs: SweepInputs, a: str, b: str) -> dict:
    out: dict = {}
    for arm in (a, b):
        vals = [r.samples_per_s for r in inputs.arm_runs(arm)]
        measured = [x for x in vals if x is not None]
        out[arm] = float(np.mean(measured)) if vals and len(measured) == len(vals) else None
    out["ratio"] = out[b] / out[a] if out[a] and out[b] else None
    out["slowdown"] = 1.0 - out["ratio"] if out["ratio"] is not None else None
    return out
