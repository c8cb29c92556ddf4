"""The per-horizon effect study's reading and summary (studies/per_horizon_effect.py runs the sweeps, and
studies/effect_curves.py reads the same epoch lines): the trainer's epoch lines read back, and per setting the
effect of each contrast per horizon over seeds."""

from __future__ import annotations

import numpy as np

from perception.contract import QUERY_DIAGNOSTICS as DIAGNOSTICS

CONTRASTS = {
    "per_horizon - shared_skip": ("per_horizon", "shared_skip"),
    "per_horizon - shared": ("per_horizon", "shared"),
    "shared_skip - shared": ("shared_skip", "shared"),
}


def epoch_line(line: str) -> tuple[int, int, dict] | None:
    """(E, N, key=value pairs) of a trainer line '[perception] <run> epoch E/N: k=v ...', else None."""
    head, sep, tail = line.partition(": ")
    if not (sep and head.startswith("[perception]") and " epoch " in head):
        return None
    done, total = head.rsplit(" epoch ", 1)[1].split("/")
    return int(done), int(total), {k: float(v) for k, v in (kv.split("=", 1) for kv in tail.split() if "=" in kv)}


def last_epoch(output: str) -> dict | None:
    """key=value pairs of the trainer's last epoch line, if that is its final epoch (E = N)."""
    parsed = [e for e in map(epoch_line, output.splitlines()) if e is not None]
    if not parsed or parsed[-1][0] != parsed[-1][1]:
        return None
    return parsed[-1][2]


def summarize(runs: list[dict]) -> dict:
    """Per world, arms, overrides and mode: each arm's mean AUC per horizon and every contrast's mean, sd and
    count of positive effects over seeds (a seed's effect: the mean over its folds), with the sweeps' gate
    decisions, attribution verdicts and query diagnostics."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r.get("auc"):
            groups.setdefault((r["world"], tuple(r["arms"]), tuple(r["extra"]), r.get("mode", "sweep")), []).append(r)
    settings = []
    for (world, arms, extra, mode), rows in sorted(groups.items()):
        horizons = rows[0]["horizons"]
        auc = {arm: np.array([np.mean(r["auc"][arm], axis=0) for r in rows]) for arm in arms}  # (seeds, H)
        contrasts = {}
        for name, (b, a) in CONTRASTS.items():
            if a not in arms or b not in arms:
                continue
            d = auc[b] - auc[a]
            contrasts[name] = {
                f"h{h}": {
                    "mean": float(d[:, j].mean()),
                    "sd": float(d[:, j].std(ddof=1)) if len(d) > 1 else None,
                    "positive": int((d[:, j] > 0).sum()),
                }
                for j, h in enumerate(horizons)
            }
        settings.append(
            {
                "world": world,
                "arms": list(arms),
                "extra": list(extra),
                "mode": mode,
                "n_seeds": len(rows),
                "seeds": sorted(r["seed"] for r in rows),
                "horizons": horizons,
                "auc_mean": {
                    arm: dict(zip((f"h{h}" for h in horizons), auc[arm].mean(axis=0).tolist())) for arm in arms
                },
                "contrasts": contrasts,
                "decisions": {
                    d: sum(str(r["decision"]) == d for r in rows) for d in sorted({str(r["decision"]) for r in rows})
                },
                "verdicts": {
                    v: sum(str(r["verdict"]) == v for r in rows) for v in sorted({str(r["verdict"]) for r in rows})
                },
                "diagnostics_median": {
                    arm: {k: _median([r["diagnostics"][arm][k] for r in rows]) for k in DIAGNOSTICS} for arm in arms
                },
                "W_mean": _mean([r.get("W") for r in rows]),  # the gate's weighted lift (sweeps only)
                "median_sweep_s": float(np.median([r["seconds"] for r in rows])),
                "machine": rows[0].get("machine"),
            }
        )
    return {"settings": settings}


def print_summary(doc: dict) -> None:
    settings = doc["settings"]
    for s in settings:
        print(f"\n{s['world']} [{s['mode']}] {' '.join(s['extra'])}  (n = {s['n_seeds']} seeds, {s['machine']})")
        print("| contrast | " + " | ".join(f"h{h}" for h in s["horizons"]) + " |")
        print("|---|" + "---|" * len(s["horizons"]))
        for name, per_h in s["contrasts"].items():
            print(
                f"| {name} | "
                + " | ".join(
                    f"{v['mean']:+.4f} ± {v['sd']:.4f} ({v['positive']}/{s['n_seeds']} > 0)"
                    if v["sd"] is not None
                    else f"{v['mean']:+.4f}"
                    for v in per_h.values()
                )
                + " |"
            )
        print(f"decisions {s['decisions']}; attribution verdicts {s['verdicts']}")
        print(
            "diagnostics (median): "
            + "; ".join(
                f"{arm}: " + ", ".join(f"{k} {v:.3f}" for k, v in d.items() if v is not None)
                for arm, d in s["diagnostics_median"].items()
            )
        )


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None
