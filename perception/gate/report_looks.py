"""report.md's section on the looks of a sequential study (DESIGN §7): every look's W, G, p against its
boundary, why the study stopped or goes on, and the trainings and GPU rounds it used against the fixed
design's."""

from __future__ import annotations

from typing import Any


def looks_section(s: dict) -> list[str]:
    if s.get("design") != "sequential":
        return []
    b, c = s["boundaries"], s["cost"]
    lines = [
        "## Looks (sequential design)",
        "",
        f"Up to {s['max_looks']} waves of replicates, decided at every look; {b['spending']}: look k spends "
        f"alpha_k of alpha {b['alpha']:g} (the rule tested first at alpha_k / 2, the other at alpha_k once it "
        "is rejected); before the last look the study stops as keep when both rules' p exceed the futility "
        "bound (non-binding). The interval is the repeated confidence interval at the look's alpha_k: it "
        "covers the true lift at every look at once with probability at least 1 - alpha. After an early "
        "ship the lift itself reads high (the study stopped because it was large).",
        "",
        "| look | replicates | W | G | p (W) | p (G) | alpha_k | futility: p > | verdict | repeated CI of the "
        "deciding lift |" + (" attribution |" if any(r["attribution_verdict"] for r in s["looks"]) else ""),
        "|---|---|---|---|---|---|---|---|---|---|"
        + ("---|" if any(r["attribution_verdict"] for r in s["looks"]) else ""),
    ]
    for r in s["looks"]:
        ci = r["repeated_ci"]
        lines.append(
            f"| {r['look']} | {r['replicates']} | {_n(r['W'], '+.4f')} | {_n(r['G'], '+.4f')} | {_n(r['p_W'])} | "
            f"{_n(r['p_G'])} | {_n(r['efficacy_alpha'])} | {_n(r['futility_p'], 'g')} | {r['verdict']} | "
            f"{r['lift']} in [{_n(ci[0], '+.4f')}, {_n(ci[1], '+.4f')}] |"
            + (f" {r['attribution_verdict'] or '–'} |" if any(x["attribution_verdict"] for x in s["looks"]) else "")
        )
    stopped = (
        f"Stopped at look {s['stopped_at']} of {s['max_looks']}: {s['why_stopped']}."
        if s["stopped_at"]
        else f"Not stopped: {s['why_stopped']}; the next wave trains replicate {s['next_wave']['replicate']} "
        f"({s['next_wave']['trainings']} trainings)."
    )
    lines += [
        "",
        stopped,
        "",
        f"Used {c['trainings']} trainings ({c['gpu_rounds_on_6']} GPU rounds on six GPUs, a wave's idle GPUs "
        f"training the next wave's first) against the fixed design's {c['fixed_trainings']} "
        f"({c['fixed_gpu_rounds_on_6']} rounds)."
        + (
            f" On six GPUs its last wave also trained {c['trained_ahead_on_6']} of the next one's (kept as runs)."
            if c.get("trained_ahead_on_6")
            else ""
        ),
        "",
    ]
    return lines


def _n(x: Any, fmt: str = ".4g") -> str:
    return "–" if x is None else format(x, fmt)
