"""Learning curves of per_horizon against shared_skip: per epoch, every horizon's validation AUC and the
query diagnostics, from the trainer's epoch lines that `studies/effect_curves_device.sh` logs.

    python studies/effect_curves.py LOGDIR [--note TEXT]   # LOGDIR/<setting>.<arm>.log -> JSON + plot

Each log line is "<unix time> [perception] <run> epoch E/N: key=value ...". Writes
studies/results/per_horizon_extremes_curves.json and .png (h20 and h40 per epoch, one panel a setting).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.studies.per_horizon_effect import epoch_line  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "per_horizon_extremes_curves"


def read_log(path: Path) -> list[dict]:
    """Each line "<unix time> <trainer epoch line>" -> {epoch, t (s since the first), metrics}."""
    stamped = [
        (int(stamp), epoch_line(rest))
        for stamp, _, rest in (line.partition(" ") for line in path.read_text().splitlines())
    ]
    stamped = [(t, parsed) for t, parsed in stamped if parsed is not None]
    return [{"epoch": e, "t": t - stamped[0][0], **metrics} for t, (e, _, metrics) in stamped]


def collect(logdir: Path, settings: dict[str, str]) -> dict:
    curves: dict[str, dict] = {}
    for path in sorted(logdir.glob("*.*.log")):
        name, arm = path.name[: -len(".log")].split(".", 1)
        curves.setdefault(name, {"overrides": settings.get(name, ""), "arms": {}})["arms"][arm] = read_log(path)
    return curves


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(curves)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        for arm, color in (("per_horizon", "tab:blue"), ("shared_skip", "tab:orange")):
            rows = curves[name]["arms"].get(arm) or []
            for h, style in (("20", ":"), ("40", "-")):
                ax.plot(
                    [r["epoch"] for r in rows],
                    [r[f"val_auc_h{h}"] for r in rows],
                    style,
                    color=color,
                    label=f"{arm} h{h}",
                )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("epoch")
    axes[0][0].set_ylabel("validation AUC")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logdir", type=Path)
    p.add_argument("--settings", type=Path, help="the lines 'NAME|overrides' the device script ran")
    p.add_argument("--note", default="", help="where and how it ran")
    args = p.parse_args()
    settings = {}
    if args.settings:
        settings = dict(line.split("|", 1) for line in args.settings.read_text().splitlines() if "|" in line)
    curves = collect(args.logdir, settings)
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps({"note": args.note, "settings": curves}, indent=1) + "\n")
    plot(curves, OUT.with_suffix(".png"))
    for name, c in sorted(curves.items()):
        for arm, rows in sorted(c["arms"].items()):
            at8 = next((r for r in rows if r["epoch"] == 8), rows[-1] if rows else None)
            if at8:
                print(
                    f"{name:4s} {arm:12s} epochs {len(rows):3d}  epoch {at8['epoch']}: h20 {at8['val_auc_h20']:.3f} "
                    f"h40 {at8['val_auc_h40']:.3f}  {c['overrides']}"
                )


if __name__ == "__main__":
    main()
