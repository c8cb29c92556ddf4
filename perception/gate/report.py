"""The gate's report (DESIGN §7): report.json (every number), report.md (what a researcher reads in
the MLflow UI), auc_by_horizon.png and attention_by_lag.png. Every file is written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from perception.atomic import atomic_path, atomic_write_text
from perception.contract import NOT_MEASURED
from perception.gate.config import GateConfig
from perception.gate.decision import GateResult
from perception.gate.first_screen import RULE_MEANING, first_screen
from perception.gate.inputs import SweepInputs
from perception.gate.report_looks import looks_section
from perception.gate.study import UNATTRIBUTED, Study


MIN_GPU_SAMPLES = 10  # a run's median of fewer says more about its start than its training


def _gpu_cell(runs: list) -> str:
    """The median over runs of each run's median utilisation, from the runs with enough samples."""
    enough = [r.gpu_utilization for r in runs if r.gpu_samples >= MIN_GPU_SAMPLES]
    if enough:
        return _num(float(np.median(enough)), ".0f")
    if runs:
        return f"too few samples (at most {max(r.gpu_samples for r in runs)} a run, {MIN_GPU_SAMPLES} needed)"
    return "–"


def _comparison_json(result: GateResult) -> dict:
    """Which arms a comparison beside the main one set against each other, what it decided, and on what."""
    return {
        "control": result.control,
        "treatment": result.treatment,
        "decision": result.decision,
        "W": result.W,
        "G": result.G,
        "p": result.p,
    }


def summary_json(study: Study, inputs: SweepInputs, cfg: GateConfig) -> dict:
    """Every number behind the decision, JSON-safe (NaN -> null)."""
    result = study.main
    runs = {
        f"{a}/f{f}" + (f"/r{r}" if r else ""): {
            "run_id": x.run_id,
            "final_auc": dict(zip(map(str, inputs.horizons), x.final_auc)),
            "samples_per_s": x.samples_per_s,
            "gpu_utilization": x.gpu_utilization,
            "gpu_samples": x.gpu_samples,
            "n_windows": len(x.predictions.index),
            "diagnostics": x.diagnostics,
        }
        for (a, f, r), x in sorted(inputs.runs.items())
    }
    return _clean(
        {
            "sweep_id": inputs.sweep_id,
            "decision": result.decision,
            "refused": False,
            "rule": result.rule,
            "control": result.control,
            "treatment": result.treatment,
            "arms": inputs.arms,
            "replicates": inputs.replicates,
            "W": result.W,
            "G": result.G,
            "p": result.p,
            "delta": {f"h{h}": d for h, d in result.delta.items()},
            "training_noise": result.training_noise,
            "multiplicity": result.multiplicity,
            "mde": result.mde,
            "noise_file": study.noise.source if study.noise is not None else None,
            "attribution": None
            if study.attribution is None
            else {
                **_comparison_json(study.attribution),
                "delta": {f"h{h}": d for h, d in study.attribution.delta.items()},
                "mde": study.attribution.mde,
                "verdict": study.verdict,
            },
            "context_path": None if study.context_path is None else _comparison_json(study.context_path),
            "diagnostics": study.diagnostics,
            "flags": study.flags,
            "plan": study.plan,
            "exploratory": bool(study.exploratory),
            "differs_from_plan": study.exploratory,
            "reasons": result.reasons,
            "notes": inputs.notes + result.notes,
            "config": {
                "source": cfg.source,
                "weights": {f"h{h}": w for h, w in cfg.weights.items()},
                "min_lift": cfg.min_lift,
                "noise_floor": cfg.noise_floor,
                "shift_horizons": cfg.shift_horizons,
                "shift_allows_loss": cfg.shift_allows_loss,
                "alpha": cfg.alpha,
                "n_bootstrap": cfg.n_bootstrap,
                "seed": cfg.seed,
            },
            "rules": [vars(r) for r in result.rules],
            "auc": {v: {"per_fold": a["per_fold"], "mean": a["mean"], "std": a["std"]} for v, a in result.auc.items()},
            "horizons": inputs.horizons,
            "n_folds": inputs.n_folds,
            "block_len_windows": result.block_len,
            "window": inputs.window,
            "window_stride": inputs.stride,
            "per_fold": result.per_fold,
            "throughput": result.throughput,
            "params": inputs.params,
            "runs": runs,
            "parent_run_id": inputs.parent_run_id,
            "tracking_uri": inputs.tracking_uri,
            "running_ignored": inputs.running,
        }
    )


def mde_sentence(result: GateResult) -> str:
    """How large an effect this sweep could see: a "no" rules out effects of this size, not smaller ones."""
    mde = result.mde
    if not math.isfinite(mde.get("W", math.nan)):
        return "Minimum detectable effect: not available (no standard error for rule 1)."
    g = f"; by rule 2 a true G of {mde['G']:+.4f} or more (with W = 0)" if math.isfinite(mde.get("G", math.nan)) else ""
    return (
        f"Power: this sweep would ship a true W of {mde['W']:+.4f} or more 8 times in 10 (rule 1 at its "
        f"Holm level alpha / 2){g}; it saw W = {result.W:+.4f}, G = {result.G:+.4f}."
    )


def lead_lines(result: GateResult, noise_floor: float) -> list[str]:
    """The rule that decided and the evidence that carried it (the test's p, or the noise floor), in
    words: what a reader needs before any caveat or table."""
    fired = next((r for r in result.rules if r.name == result.rule), None)
    if fired is None:
        needs = "; ".join(f"{_named(r)} needs {r.statement}, saw {r.lift_name} = {r.lift:+.4f}" for r in result.rules)
        return [
            f"**Rule:** none fired ({needs}), so the control is kept.",
            "",
            "**Evidence:** none is needed to keep the control; the power line under Caveats says how large a "
            "lift this sweep could have missed.",
            "",
        ]
    others = [r for r in result.rules if r is not fired]
    order = "".join(
        f"; {_named(r)} {'also holds, but ' + fired.name + ' decides' if r.fired else 'did not fire'}"
        f" ({r.lift_name} = {r.lift:+.4f})"
        for r in others
    )
    rule = (
        f"**Rule:** {_named(fired)} fired ({fired.statement}) on {', '.join(f'h{h}' for h in fired.horizons)}: "
        f"{fired.lift_name} = {fired.lift:+.4f}{order}."
    )
    test = (
        f"p = {fired.p_bootstrap:.4g} {'<' if fired.evidence_test else '>='} its Holm level {fired.level:g}"
        if math.isfinite(fired.p_bootstrap)
        else "no p"
    )
    floor = (
        f"lower bound {fired.lower_bound:+.4f} {'>=' if fired.evidence_floor else '<'} noise floor {noise_floor:g}"
        if math.isfinite(fired.lower_bound)
        else "no lower bound"
    )
    if fired.evidence_test and fired.evidence_floor:
        evidence = f"**Carried by the test and the noise floor:** {test}; {floor}."
    elif fired.evidence_test:
        evidence = (
            f"**Carried by the test:** {test}, enough on its own (the noise floor, the other route to "
            f"evidence, would take a lower bound of {noise_floor:g} or more; it is "
            f"{fired.lower_bound:+.4f})."
        )
    elif fired.evidence_floor:
        evidence = f"**Carried by the noise floor:** {floor}, enough on its own (the test: {test})."
    else:
        evidence = (
            f"**Not carried:** neither the test ({test}) nor the noise floor ({floor}) gives evidence, "
            f"so the lift may be noise: `{result.decision}`."
        )
    return [rule, "", evidence, ""]


def _named(rule) -> str:
    """`rule 1 (lift at the deployment horizons)`: the rule's number and what it means."""
    return f"{rule.name} ({RULE_MEANING[rule.name]})" if rule.name in RULE_MEANING else rule.name


def _caveats(s: dict, study: Study) -> list[str]:
    """What qualifies the decision, most important first: the plan, attribution, power, evidence, notes."""
    result = study.main
    caveats = []
    if study.exploratory:
        caveats.append("exploratory: the gate's settings differ from the sweep's plan: " + "; ".join(study.exploratory))
    caveats += [r for r in result.reasons if r.startswith(UNATTRIBUTED)]
    caveats += [f"flag: {f}" for f in study.flags if not any(r.startswith(UNATTRIBUTED) for r in result.reasons)]
    if study.verdict and study.attribution is not None:  # a verdict comes with the attribution it judges
        caveats.append(f"attribution ({study.attribution.control} → {study.attribution.treatment}): {study.verdict}")
    caveats += [mde_sentence(result), f"Evidence: {result.training_noise}."]
    return caveats + s["notes"]


def refusal_json(sweep_id: str, reasons: list[str], notes: list[str], running: Optional[list[str]] = None) -> dict:
    return {
        "sweep_id": sweep_id,
        "decision": None,
        "refused": True,
        "reasons": reasons,
        "notes": notes,
        "running_ignored": running or [],
    }


def write_report(
    out_dir: Path, summary: dict, inputs: Optional[SweepInputs] = None, study: Optional[Study] = None
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "report.json", out_dir / "report.md"]
    atomic_write_text(files[0], json.dumps(summary, indent=2) + "\n")
    atomic_write_text(files[1], _markdown(summary, inputs, study))
    if inputs is not None and study is not None:
        files.append(_plot_auc(out_dir / "auc_by_horizon.png", inputs, study.main))
        attention = _plot_attention(out_dir / "attention_by_lag.png", inputs)
        if attention is not None:
            files.append(attention)
    return files


# ---------------------------------------------------------------- markdown


def _markdown(s: dict, inputs: Optional[SweepInputs], study: Optional[Study]) -> str:
    lines = [f"# Decision gate: sweep `{s['sweep_id']}`", ""] + first_screen(s, study, inputs)
    if s["refused"]:
        lines += ["## What is wrong", ""]
        lines += [f"- {r}" for r in s["reasons"]]
        lines += _notes(s["notes"])
        return "\n".join(lines) + "\n"
    assert inputs is not None and study is not None
    result = study.main
    a, b = result.control, result.treatment
    label = {a: f"A {a}", b: f"B {b}"}
    lines += [
        "## The decision in numbers",
        "",
        f"**Decision: `{s['decision']}`**"
        + (f" (by {s['rule']})" if s["rule"] else "")
        + f" — control `{a}`, treatment `{b}`, {len(inputs.replicates)} replicate(s) per fold"
        + (" — **exploratory**: the gate's settings differ from the sweep's plan" if study.exploratory else ""),
        "",
    ] + lead_lines(result, s["config"]["noise_floor"])
    lines += ["## Caveats", ""] + [f"- {c}" for c in _caveats(s, study)] + [""]
    lines += looks_section(s)
    lines += ["## Why", ""] + [f"- {r}" for r in s["reasons"]] + [""]
    cfg = s["config"]
    lines += [
        f"Config `{cfg['source']}`: weights {cfg['weights']}, min_lift {cfg['min_lift']}, "
        f"noise floor {cfg['noise_floor']}, shift horizons {cfg['shift_horizons']} "
        f"(shift_allows_loss {cfg['shift_allows_loss']}), alpha {cfg['alpha']}, "
        f"{cfg['n_bootstrap']} resamples, seed {cfg['seed']}.",
        "",
    ]
    if study.plan is not None:
        lines += [
            "Pre-registered plan (the parent run's `gate_plan`): "
            + (
                "kept."
                if not study.exploratory
                else "not kept, so this decision is exploratory: " + "; ".join(study.exploratory) + "."
            ),
            "",
        ]

    lines += [
        "## Final-epoch validation AUC (mean ± std over folds)",
        "",
        f"| horizon | weight | {label[a]} | {label[b]} | Δ = B − A | per-fold Δ |",
        "|---|---|---|---|---|---|",
    ]
    for j, h in enumerate(inputs.horizons):
        cells = [f"{result.auc[v]['mean'][j]:.4f} ± {result.auc[v]['std'][j]:.4f}" for v in (a, b)]
        folds = result.auc[b]["per_fold"][:, j] - result.auc[a]["per_fold"][:, j]
        lines.append(
            f"| h{h} | {cfg['weights'].get(f'h{h}', 0)} | "
            + " | ".join(cells)
            + f" | {result.delta[h]:+.4f} | "
            + ", ".join(f"{d:+.4f}" for d in folds)
            + " |"
        )
    lines.append("")

    lines += _attribution_section(study)
    lines += [
        "## Evidence",
        "",
        f"Validation windows overlap (window {inputs.window}, label up to {max(inputs.horizons)} snapshots "
        f"ahead, stride {inputs.stride}), so the bootstrap resamples blocks of {result.block_len} windows, "
        "the same blocks for every run of a fold. A rule's lift is tested against se² = se²(windows) + "
        "se²(training): the block bootstrap of what the fold's replicates share, plus the variance of one "
        "(fold, replicate) cell's lift from training noise over F·R cells (between replicates with R ≥ 2, "
        "else a shipped A/A measurement); with one replicate and no A/A measurement, se² is the "
        "between-fold variance of the per-fold lift over F (F − 1 df). The test is a t with "
        "Satterthwaite's degrees of freedom, because the training variance is estimated from few cells "
        "(df ∞: not estimated). One alpha covers both rules: Holm's step-down tests the smaller p at "
        "alpha / 2 and, if it is rejected, the other at alpha; the lower bound is taken at the same level. "
        "Assumes folds independent, replicates exchangeable and cell lifts roughly normal. DeLong on "
        "windows thinned to one per K + h snapshots is reported beside it; the i.i.d. DeLong on all "
        "windows only exposes how much it overstates.",
        "",
        "| rule | lift | fired | se (windows, training) | df | Holm level | lower bound | floor met | p | "
        "minimum detectable | thinned DeLong p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.rules:
        lines.append(
            f"| {r.name}: {r.statement} | {r.lift_name} = {r.lift:+.4f} | {'yes' if r.fired else 'no'} | "
            f"{_num(r.se)} ({_num(r.se_windows)}, {_num(r.se_training)}) | "
            f"{'∞' if math.isinf(r.df) else format(r.df, '.1f')} | {_num(r.level)} | "
            f"{_num(r.lower_bound, '+.4f')} | {'yes' if r.evidence_floor else 'no'} | {_num(r.p_bootstrap)} | "
            f"{_num(r.mde, '+.4f')} | {_num(r.p_delong_thinned)} |"
        )
    lines += [
        "",
        "| fold | horizon | windows | Δ (predictions) | bootstrap se | bootstrap p | "
        "thinned DeLong (n, p) | i.i.d. DeLong p (invalid) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result.per_fold:
        boot, thin, iid = row["bootstrap"], row["delong_thinned"], row["delong_iid"]
        lines.append(
            f"| {row['fold']} | h{row['horizon']} | {row['n_windows']} | "
            + (
                f"{boot['delta']:+.4f} | {boot['se']:.4f} | {_num(boot['p'])}"
                if boot
                else f"{iid['delta']:+.4f} | – | –"
            )
            + f" | {thin['n']}, {_num(thin['p'])} | {_num(iid['p'])} |"
        )
    lines.append("")

    lines += _diagnostics_section(study)
    t = result.throughput
    lines += [
        "## Training throughput (samples/s, median over epochs, mean over runs)",
        "",
        f"| | {label[a]} | {label[b]} | B / A |",
        "|---|---|---|---|",
        f"| samples/s | {_num(t[a], '.1f')} | {_num(t[b], '.1f')} | {_num(t['ratio'], '.3f')} |",
    ]
    sampled = {v: [r for r in inputs.arm_runs(v) if r.gpu_utilization is not None] for v in (a, b)}
    if any(sampled.values()):  # on a GPU: is the slower arm starved, or just doing more work?
        lines.append(
            f"| GPU utilisation % (median of system metrics, median over runs) | {_gpu_cell(sampled[a])} "
            f"| {_gpu_cell(sampled[b])} | |"
        )
    lines.append("")

    lines += ["## Attention by lag (mean mass per query over lag buckets, mean over runs)", ""]
    profiles = _attention_profiles(inputs)
    if not profiles:
        lines.append("No run logged diagnostics/attention_by_lag.npz.")
    else:
        edges = next(iter(profiles.values()))[0]
        lines += [
            "| arm / query | " + " | ".join(_bucket(x, y) for x, y in zip(edges[:-1], edges[1:])) + " |",
            "|---|" + "---|" * (len(edges) - 1),
        ]
        for v in inputs.arms:
            if v in profiles:
                _, mass, names = profiles[v]
                lines += [
                    f"| {v} / {q} | " + " | ".join(f"{x:.3f}" for x in mass[i]) + " |" for i, q in enumerate(names)
                ]
        lines += ["", "Side by side in `attention_by_lag.png`."]
    lines.append("")
    lines += ["## Runs", "", "| run | MLflow run | windows |", "|---|---|---|"]
    lines += [f"| {k} | `{r['run_id']}` | {r['n_windows']} |" for k, r in s["runs"].items()]
    p = s["params"]
    lines += [
        "",
        f"data_hash `{p.get('data_hash')}`, git_sha `{p.get('git_sha')}`, "
        f"epochs {p.get('trainer.epochs')}, folds {p.get('data.n_folds')}, replicates {inputs.replicates}.",
    ]
    return "\n".join(lines) + "\n"


def _attribution_section(study: Study) -> list[str]:
    if study.attribution is None:
        return []
    lines = [
        "## Attribution: per-horizon queries or the context path?",
        "",
        "`shared_skip` feeds one shared query's context to the same Path-A heads, so it differs from "
        "`per_horizon` only in the queries. The same rule and evidence decide each comparison.",
        "",
        "| comparison | decision | W | G | p |",
        "|---|---|---|---|---|",
    ]
    for r in (study.main, study.attribution, study.context_path):
        if r is not None:
            lines.append(f"| {r.control} → {r.treatment} | `{r.decision}` | {r.W:+.4f} | {r.G:+.4f} | {_num(r.p)} |")
    return lines + ["", f"**Verdict: {study.verdict}.**", ""]


def _diagnostics_section(study: Study) -> list[str]:
    keys = (
        "grad_norm_pool_query",
        "grad_norm_trunk",
        "grad_norm_heads",
        "query_divergence",
        "attention_entropy_ratio",
        "query_drift",
    )
    lines = [
        "## Learning signal (final epoch, median over runs)",
        "",
        "| arm | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for arm, d in study.diagnostics.items():
        lines.append(
            f"| {arm} | " + " | ".join(NOT_MEASURED if d.get(k) is None else f"{d[k]:.3g}" for k in keys) + " |"
        )
    lines += [""] + [f"- **flag**: {f}" for f in study.flags] + ([""] if study.flags else [])
    return lines


def _notes(notes: list[str]) -> list[str]:
    return (["", "## Notes", ""] + [f"- {n}" for n in notes]) if notes else []


def _bucket(a: int, b: int) -> str:
    return f"{a}–{b - 1}" if b - a > 1 else str(a)


def _num(x: Any, fmt: str = ".4g") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


# ---------------------------------------------------------------- plots


def _attention_profiles(inputs: SweepInputs) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per arm: (lag_edges, mass (Q, n_buckets) averaged over the folds that logged it, names)."""
    out = {}
    for v in inputs.arms:
        atts = [a for r in inputs.arm_runs(v) if (a := r.attention) is not None]
        if atts and all(
            np.array_equal(a.lag_edges, atts[0].lag_edges) and a.mass.shape == atts[0].mass.shape for a in atts
        ):
            out[v] = (atts[0].lag_edges, np.mean([a.mass for a in atts], axis=0), atts[0].query_names)
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_auc(path: Path, inputs: SweepInputs, result: GateResult) -> Path:
    plt = _plt()
    hs = inputs.horizons
    x = np.arange(len(hs))
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = (result.control, result.treatment)
    for k, (v, color) in enumerate(zip(arms, ("tab:blue", "tab:orange"))):
        a = result.auc[v]
        off = (k - 0.5) * 0.18
        ax.errorbar(
            x + off, a["mean"], yerr=a["std"], fmt="o-", color=color, capsize=4, label=f"{'AB'[k]} {v} (mean ± std)"
        )
        for f in range(inputs.n_folds):
            ax.scatter(x + off, a["per_fold"][f], s=12, color=color, alpha=0.45)
    ax.set_xticks(x, [f"h{h}" for h in hs])
    ax.set_ylabel("final-epoch validation AUC")
    ax.set_title("AUC by horizon (dots: folds)")
    ax.legend(fontsize=8)
    deltas = result.auc[arms[1]]["per_fold"] - result.auc[arms[0]]["per_fold"]  # (F, H)
    dx.axhline(0, color="grey", lw=0.8)
    dx.bar(x, [result.delta[h] for h in hs], color="tab:green", alpha=0.6, label="Δ = B − A (mean)")
    for f in range(inputs.n_folds):
        dx.scatter(x, deltas[f], s=14, color="black", alpha=0.6, label="folds" if f == 0 else None)
    dx.set_xticks(x, [f"h{h}" for h in hs])
    dx.set_title(f"decision: {result.decision}  (W = {result.W:+.4f}, G = {result.G:+.4f})")
    dx.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def _plot_attention(path: Path, inputs: SweepInputs) -> Optional[Path]:
    profiles = _attention_profiles(inputs)
    if not profiles:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(inputs.arms), figsize=(5.5 * len(inputs.arms), 4), sharey=True, squeeze=False)
    for ax, v in zip(axes[0], inputs.arms):
        ax.set_title(v)
        if v not in profiles:
            ax.text(0.5, 0.5, "not logged", ha="center", transform=ax.transAxes)
            continue
        edges, mass, names = profiles[v]
        for q, name in enumerate(names):
            ax.step(np.arange(mass.shape[1]), mass[q], where="mid", label=name)
        ax.set_xticks(
            np.arange(mass.shape[1]), [_bucket(a, b) for a, b in zip(edges[:-1], edges[1:])], rotation=45, fontsize=7
        )
        ax.set_xlabel("lag (snapshots before the window's end)")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("mean attention mass")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x
