"""The precision study's settings and verdicts (studies/precision_quality.py trains the runs): a setting's
Hydra overrides, and the setting against the seed-to-seed spread of fp32 runs, by one same-seed comparison or
by a paired equivalence test over seeds."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

PRECISIONS = ("fp32", "tf32", "bf16")
# What a run trained, read back from its resolved config: a switch its setting leaves unnamed takes the
# experiment's value, and that changes with the experiment (production's SSD and VSN did), so a verdict
# names the forms it compared
FORM_KEYS = (
    "trainer.precision",
    "model.compile_trunk",
    "model.mamba.ssd",
    "model.mamba.chunk",
    "model.vsn.fused_grn",
    "model.vsn.fold_embed",
)


# A setting's parts after its precision, each the config key and value it names ('chunkN': model.mamba.chunk=N)
SWITCHES = {
    "compiled": ("model.compile_trunk", True),
    "fla": ("model.mamba.ssd", "fla"),
    "mamba": ("model.mamba.ssd", "mamba"),
    "fusedgrn": ("model.vsn.fused_grn", True),
    "folded": ("model.vsn.fold_embed", True),
}


def switches_of(setting: str) -> tuple[dict, list[str]]:
    """'bf16+compiled+chunk128' -> ({config key: value} in the setting's order, the parts it does not know): the
    settings' one grammar, for the precision study and benchmarks/determinism.py alike."""
    named: dict = {}
    unknown = []
    for part in setting.split("+"):
        if part in PRECISIONS:
            named["trainer.precision"] = part
        elif part in SWITCHES:
            key, value = SWITCHES[part]
            named[key] = value
        elif part.startswith("chunk") and part.removeprefix("chunk").isdigit():
            named["model.mamba.chunk"] = int(part.removeprefix("chunk"))
        else:
            unknown.append(part)
    return named, unknown


def overrides_of(setting: str) -> list[str]:
    """'bf16+compiled+fla' -> Hydra overrides; an unknown part is an error naming it. `chunkN` sets
    model.mamba.chunk (the runs place a setting's overrides after the study's, so a setting's chunk wins)."""
    named, unknown = switches_of(setting)
    if unknown:
        raise SystemExit(
            f"--settings {setting!r}: unknown part {unknown[0]!r}; expected {', '.join(PRECISIONS)}, "
            f"compiled, fla, mamba, fusedgrn, folded or chunkN (e.g. chunk128), joined by '+'"
        )
    if "trainer.precision" not in named:
        raise SystemExit(f"--settings {setting!r}: name a precision ({', '.join(PRECISIONS)})")
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in named.items()]


def form_of(config: dict, source: str) -> dict:
    """FORM_KEYS' values in a run's resolved config (its config.yaml, read as a dict)."""
    from omegaconf import OmegaConf

    tree, absent = OmegaConf.create(config), object()
    form = {key: OmegaConf.select(tree, key, default=absent) for key in FORM_KEYS}
    for key, value in form.items():
        if value is absent:
            raise ValueError(f"{source}: no {key} in the run's resolved config")
    return form


def forms_of(rows: list[dict]) -> dict[str, dict | None]:
    """The form each setting's finished runs trained (None: runs made before rows recorded it). A setting
    whose runs trained different forms is refused: one verdict over them would measure two things."""
    found = defaultdict(set)
    for r in rows:
        if "auc" in r:
            found[r["setting"]].add(json.dumps(r.get("form"), sort_keys=True))
    forms = {}
    for setting, kinds in sorted(found.items()):
        if len(kinds) > 1:
            raise SystemExit(
                f"setting {setting}: its runs trained different forms ({'; '.join(sorted(kinds))}, null: not "
                "recorded); join only runs of one form"
            )
        forms[setting] = json.loads(kinds.pop())
    return forms


def equivalence(deltas: list[float], margin: float, level: float = 0.90) -> dict:
    """Mean paired difference, its two-sided `level` t-interval and the verdict against ±margin."""
    from scipy.stats import t as student_t

    n, mean = len(deltas), statistics.mean(deltas)
    half = student_t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(deltas) / n**0.5
    low, high = mean - half, mean + half
    if -margin <= low and high <= margin:
        verdict = "holds"
    elif high < -margin or low > margin:
        verdict = "differs"
    else:
        verdict = "inconclusive"
    return dict(n=n, mean_delta=mean, interval=[low, high], level=level, verdict=verdict)


def summarise(rows: list[dict], base_seed: int) -> dict:
    """The fp32 runs' spread per horizon, and per setting its runs paired with fp32 by seed and its verdict."""
    fp32 = [r for r in rows if r["setting"] == "fp32" and "auc" in r]
    if len(fp32) < 2:
        raise SystemExit(f"need at least 2 finished fp32 runs for a spread; have {len(fp32)}")
    horizons = sorted(fp32[0]["auc"], key=int)
    spread = {
        h: dict(
            min=min(r["auc"][h] for r in fp32),
            max=max(r["auc"][h] for r in fp32),
            mean=statistics.mean(r["auc"][h] for r in fp32),
            sd=statistics.stdev(r["auc"][h] for r in fp32),
        )
        for h in horizons
    }
    fp32_by_seed = {r["seed"]: r for r in fp32}
    if base_seed not in fp32_by_seed:
        raise SystemExit(f"the fp32 run of seed {base_seed} did not finish: no same-seed comparison")
    runs = defaultdict(list)  # setting -> its finished runs that have a same-seed fp32 run
    for r in rows:
        if r["setting"] != "fp32" and "auc" in r and r["seed"] in fp32_by_seed:
            runs[r["setting"]].append(r)
    settings = {}
    for name, its in runs.items():
        its = sorted(its, key=lambda r: r["seed"])
        first = next((r for r in its if r["seed"] == base_seed), its[0])
        per_h = {}
        for h in horizons:
            deltas = [r["auc"][h] - fp32_by_seed[r["seed"]]["auc"][h] for r in its]
            auc = statistics.mean(r["auc"][h] for r in its)
            cell = dict(
                auc=auc,
                delta_same_seed=first["auc"][h] - fp32_by_seed[first["seed"]]["auc"][h],
                deltas={str(r["seed"]): d for r, d in zip(its, deltas)},
                within_sd=all(abs(d) <= spread[h]["sd"] for d in deltas),
                inside_range=spread[h]["min"] <= auc <= spread[h]["max"],
            )
            if len(its) >= 2:
                cell["equivalence"] = equivalence(deltas, spread[h]["sd"])
            per_h[h] = cell
        if len(its) >= 2:
            verdicts = [v["equivalence"]["verdict"] for v in per_h.values()]
            verdict = "differs" if "differs" in verdicts else "holds" if set(verdicts) == {"holds"} else "inconclusive"
        else:
            verdict = "holds" if all(v["within_sd"] for v in per_h.values()) else "differs"
        rates = [r["samples_per_s"] for r in its if r.get("samples_per_s")]
        settings[name] = dict(
            per_horizon=per_h,
            seeds=[r["seed"] for r in its],
            verdict=verdict,
            holds=verdict == "holds",
            samples_per_s=statistics.mean(rates) if rates else None,
        )
    return dict(horizons=horizons, fp32_spread=spread, fp32_runs=len(fp32), settings=settings, forms=forms_of(rows))
