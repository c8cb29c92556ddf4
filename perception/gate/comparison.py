"""The per-fold comparison the sweep's parent run carries (DESIGN §6), shown by the MLflow UI as
tables in the run's artifacts: per horizon, the final validation AUC of A and B and B − A per fold and
their mean; the deciding horizons' tables first; beside them auc_by_horizon.png."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

COMPARISON_DIR = "comparison"
PLOT = "auc_by_horizon.png"
DIGITS = 4  # AUC to 1e-4: the UI shows the number whole


def deciding_horizons(summary: dict) -> list[int]:
    """The horizons rule 1 weighs (the deployment horizons)."""
    weights = (summary.get("config") or {}).get("weights") or {}
    return [h for h in summary["horizons"] if weights.get(f"h{h}", 0)]


def fold_tables(summary: dict) -> dict[str, dict[str, list]]:
    """{artifact file: columns}, one table per horizon: fold 0..F-1 then `mean`, A, B, B − A."""
    a, b = summary["control"], summary["treatment"]
    auc, deciding = summary["auc"], deciding_horizons(summary)
    tables = {}
    for j, h in enumerate(summary["horizons"]):
        col_a = [row[j] for row in auc[a]["per_fold"]]
        col_b = [row[j] for row in auc[b]["per_fold"]]
        diff = [y - x for x, y in zip(col_a, col_b)]
        n = len(diff)
        name = f"{'deciding_' if h in deciding else ''}val_auc_h{h}.json"
        tables[f"{COMPARISON_DIR}/{name}"] = {
            "fold": [str(f) for f in range(n)] + ["mean"],
            f"A {a}": _rounded(col_a + [sum(col_a) / n]),
            f"B {b}": _rounded(col_b + [sum(col_b) / n]),
            "B − A": _rounded(diff + [sum(diff) / n]),
        }
    return dict(sorted(tables.items(), key=lambda kv: (not kv[0].startswith(f"{COMPARISON_DIR}/deciding_"), kv[0])))


def log_comparison(client, run_id: str, summary: dict, plot: Optional[Path]) -> list[str]:
    """Logs the tables (and the plot, when there is one) to `run_id`; returns the artifact paths."""
    paths = []
    for artifact_file, columns in fold_tables(summary).items():
        client.log_table(run_id, data=columns, artifact_file=artifact_file)
        paths.append(artifact_file)
    if plot is not None and plot.is_file():
        client.log_artifact(run_id, str(plot), artifact_path=COMPARISON_DIR)
        paths.append(f"{COMPARISON_DIR}/{plot.name}")
    return paths


def _rounded(values: list) -> list:
    return [None if v is None else round(float(v), DIGITS) for v in values]
