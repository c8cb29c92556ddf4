"""The gate's report (DESIGN §7): report.json (every number), report.md (what a researcher reads in
the MLflow UI), auc_by_horizon.png and attention_by_lag.png. Every file is written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from perception.atomic import atomic_path, atomic_write_text
from perception.gate.config import GateConfig
from perception.gate.decision import GateResult
from perception.gate.inputs import VARIANTS, SweepInputs

LABEL = {"shared": "A shared", "per_horizon": "B per_horizon"}


def summary_json(result: GateResult, inputs: SweepInputs, cfg: GateConfig) -> dict:
    """Every number behind the decision, JSON-safe (NaN -> null)."""
    runs = {f"{v}/f{f}": {"run_id": r.run_id, "final_auc": dict(zip(map(str, inputs.horizons), r.final_auc)),
                          "samples_per_s": r.samples_per_s, "n_windows": len(r.predictions.index)}
            for (v, f), r in sorted(inputs.runs.items())}
    return _clean({
        "sweep_id": inputs.sweep_id, "decision": result.decision, "refused": False, "rule": result.rule,
        "W": result.W, "G": result.G, "p": result.p,
        "delta": {f"h{h}": d for h, d in result.delta.items()},
        "reasons": result.reasons, "notes": inputs.notes + result.notes,
        "config": {"source": cfg.source, "weights": {f"h{h}": w for h, w in cfg.weights.items()},
                   "min_lift": cfg.min_lift, "noise_floor": cfg.noise_floor,
                   "shift_horizons": cfg.shift_horizons, "shift_allows_loss": cfg.shift_allows_loss,
                   "alpha": cfg.alpha, "n_bootstrap": cfg.n_bootstrap, "seed": cfg.seed},
        "rules": [vars(r) for r in result.rules],
        "auc": {v: {"per_fold": a["per_fold"], "mean": a["mean"], "std": a["std"]} for v, a in result.auc.items()},
        "horizons": inputs.horizons, "n_folds": inputs.n_folds,
        "block_len_windows": result.block_len, "window": inputs.window, "window_stride": inputs.stride,
        "per_fold": result.per_fold, "throughput": result.throughput,
        "params": inputs.params, "runs": runs, "parent_run_id": inputs.parent_run_id,
        "tracking_uri": inputs.tracking_uri,
    })


def refusal_json(sweep_id: str, reasons: list[str], notes: list[str]) -> dict:
    return {"sweep_id": sweep_id, "decision": None, "refused": True, "reasons": reasons, "notes": notes}


def write_report(out_dir: Path, summary: dict, inputs: Optional[SweepInputs] = None,
                 result: Optional[GateResult] = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "report.json", out_dir / "report.md"]
    atomic_write_text(files[0], json.dumps(summary, indent=2) + "\n")
    atomic_write_text(files[1], _markdown(summary, inputs, result))
    if inputs is not None and result is not None:
        files.append(_plot_auc(out_dir / "auc_by_horizon.png", inputs, result))
        attention = _plot_attention(out_dir / "attention_by_lag.png", inputs)
        if attention is not None:
            files.append(attention)
    return files


# ---------------------------------------------------------------- markdown


def _markdown(s: dict, inputs: Optional[SweepInputs], result: Optional[GateResult]) -> str:
    lines = [f"# Decision gate: sweep `{s['sweep_id']}`", ""]
    if s["refused"]:
        lines += ["**Refused**: the runs cannot be compared. What is wrong:", ""]
        lines += [f"- {r}" for r in s["reasons"]]
        lines += _notes(s["notes"])
        return "\n".join(lines) + "\n"
    assert inputs is not None and result is not None
    lines += [f"**Decision: `{s['decision']}`**" + (f" (by {s['rule']})" if s["rule"] else ""), "",
              f"W = {s['W']:+.4f}, G = {s['G']:+.4f}, p = {_num(s['p'])} "
              f"(one-sided, paired moving-block bootstrap, Stouffer over folds and the rule's horizons)", ""]
    lines += ["## Why", ""] + [f"- {r}" for r in s["reasons"]] + [""]
    cfg = s["config"]
    lines += [f"Config `{cfg['source']}`: weights {cfg['weights']}, min_lift {cfg['min_lift']}, "
              f"noise floor {cfg['noise_floor']}, shift horizons {cfg['shift_horizons']} "
              f"(shift_allows_loss {cfg['shift_allows_loss']}), alpha {cfg['alpha']}, "
              f"{cfg['n_bootstrap']} resamples, seed {cfg['seed']}.", ""]

    lines += ["## Final-epoch validation AUC (mean ± std over folds)", "",
              "| horizon | weight | " + " | ".join(LABEL[v] for v in VARIANTS) + " | Δ = B − A | per-fold Δ |",
              "|---|---|---|---|---|---|"]
    for j, h in enumerate(inputs.horizons):
        cells = [f"{result.auc[v]['mean'][j]:.4f} ± {result.auc[v]['std'][j]:.4f}" for v in VARIANTS]
        folds = result.auc[VARIANTS[1]]["per_fold"][:, j] - result.auc[VARIANTS[0]]["per_fold"][:, j]
        lines.append(f"| h{h} | {cfg['weights'].get(f'h{h}', 0)} | " + " | ".join(cells)
                     + f" | {result.delta[h]:+.4f} | " + ", ".join(f"{d:+.4f}" for d in folds) + " |")
    lines.append("")

    lines += ["## Evidence", "",
              f"Validation windows overlap (window {inputs.window}, label up to {max(inputs.horizons)} snapshots "
              f"ahead, stride {inputs.stride}), so the bootstrap resamples blocks of {result.block_len} windows. "
              "DeLong is reported on windows thinned to one per K + h snapshots; the i.i.d. DeLong on all "
              "windows is shown only to expose how much it overstates the evidence.", "",
              "| rule | lift | fired | noise floor met | bootstrap p | thinned DeLong p |", "|---|---|---|---|---|---|"]
    for r in result.rules:
        lines.append(f"| {r.name}: {r.statement} | {r.lift_name} = {r.lift:+.4f} | {'yes' if r.fired else 'no'} | "
                     f"{'yes' if r.evidence_floor else 'no'} | {_num(r.p_bootstrap)} | {_num(r.p_delong_thinned)} |")
    lines += ["", "| fold | horizon | windows | Δ (predictions) | bootstrap se | bootstrap p | "
              "thinned DeLong (n, p) | i.i.d. DeLong p (invalid) |", "|---|---|---|---|---|---|---|---|"]
    for row in result.per_fold:
        boot, thin, iid = row["bootstrap"], row["delong_thinned"], row["delong_iid"]
        lines.append(f"| {row['fold']} | h{row['horizon']} | {row['n_windows']} | {iid['delta']:+.4f} | "
                     + (f"{boot['se']:.4f} | {_num(boot['p'])}" if boot else "– | –")
                     + f" | {thin['n']}, {_num(thin['p'])} | {_num(iid['p'])} |")
    lines.append("")

    t = result.throughput
    lines += ["## Training throughput (samples/s, median over epochs, mean over folds)", "",
              f"| {LABEL[VARIANTS[0]]} | {LABEL[VARIANTS[1]]} | B / A |", "|---|---|---|",
              f"| {_num(t[VARIANTS[0]], '.1f')} | {_num(t[VARIANTS[1]], '.1f')} | {_num(t['ratio'], '.3f')} |", ""]

    lines += ["## Attention by lag (mean mass per query over lag buckets, mean over folds)", ""]
    profiles = _attention_profiles(inputs)
    if not profiles:
        lines.append("No run logged diagnostics/attention_by_lag.npz.")
    else:
        edges = next(iter(profiles.values()))[0]
        lines += ["| arm / query | " + " | ".join(_bucket(a, b) for a, b in zip(edges[:-1], edges[1:])) + " |",
                  "|---|" + "---|" * (len(edges) - 1)]
        for v in VARIANTS:
            if v in profiles:
                _, mass, names = profiles[v]
                lines += [f"| {LABEL[v]} / {q} | " + " | ".join(f"{x:.3f}" for x in mass[i]) + " |"
                          for i, q in enumerate(names)]
        lines += ["", "Side by side in `attention_by_lag.png`."]
    lines.append("")
    lines += ["## Runs", "", "| arm | fold | run | windows |", "|---|---|---|---|"]
    lines += [f"| {k.split('/')[0]} | {k.split('/')[1]} | `{r['run_id']}` | {r['n_windows']} |" for k, r in s["runs"].items()]
    p = s["params"]
    lines += ["", f"data_hash `{p.get('data_hash')}`, git_sha `{p.get('git_sha')}`, seed {p.get('seed')}, "
              f"epochs {p.get('trainer.epochs')}, folds {p.get('data.n_folds')}."]
    lines += _notes(s["notes"])
    return "\n".join(lines) + "\n"


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
    for v in VARIANTS:
        atts = [inputs.runs[(v, f)].attention for f in range(inputs.n_folds)]
        atts = [a for a in atts if a is not None]
        if atts and all(np.array_equal(a.lag_edges, atts[0].lag_edges) and a.mass.shape == atts[0].mass.shape
                        for a in atts):
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
    for k, (v, color) in enumerate(zip(VARIANTS, ("tab:blue", "tab:orange"))):
        a = result.auc[v]
        off = (k - 0.5) * 0.18
        ax.errorbar(x + off, a["mean"], yerr=a["std"], fmt="o-", color=color, capsize=4, label=f"{LABEL[v]} (mean ± std)")
        for f in range(inputs.n_folds):
            ax.scatter(x + off, a["per_fold"][f], s=12, color=color, alpha=0.45)
    ax.set_xticks(x, [f"h{h}" for h in hs])
    ax.set_ylabel("final-epoch validation AUC")
    ax.set_title("AUC by horizon (dots: folds)")
    ax.legend(fontsize=8)
    deltas = result.auc[VARIANTS[1]]["per_fold"] - result.auc[VARIANTS[0]]["per_fold"]  # (F, H)
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
    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(11, 4), sharey=True, squeeze=False)
    for ax, v in zip(axes[0], VARIANTS):
        ax.set_title(LABEL[v])
        if v not in profiles:
            ax.text(0.5, 0.5, "not logged", ha="center", transform=ax.transAxes)
            continue
        edges, mass, names = profiles[v]
        for q, name in enumerate(names):
            ax.step(np.arange(mass.shape[1]), mass[q], where="mid", label=name)
        ax.set_xticks(np.arange(mass.shape[1]), [_bucket(a, b) for a, b in zip(edges[:-1], edges[1:])],
                      rotation=45, fontsize=7)
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
