"""Command-line options that several commands share, spelled the same in each.

`--experiment` names a Hydra experiment (conf/experiment/<name>.yaml) wherever a command trains or
calibrates; the MLflow experiment that runs are tracked in is `--mlflow-experiment`. The gate and
`perception-sweep ui` once took the MLflow one as `--experiment`: that spelling still works there, hidden
from --help, and says on stderr which option replaces it."""

from __future__ import annotations

import argparse
import sys

from perception.paths import MLFLOW_EXPERIMENT

MLFLOW_EXPERIMENT_FLAG = "--mlflow-experiment"


class _DeprecatedSpelling(argparse.Action):
    """Stores the value as the new option does, after a notice on stderr naming the new option."""

    def __init__(self, option_strings, dest, replacement: str, **kwargs):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: {option_string} is deprecated here (it names the MLflow experiment); "
            f"use {self.replacement} {values}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_mlflow_experiment(parser: argparse.ArgumentParser) -> None:
    """`--mlflow-experiment NAME` (args.mlflow_experiment), and the hidden, deprecated `--experiment NAME`
    of the same meaning."""
    parser.add_argument(
        MLFLOW_EXPERIMENT_FLAG,
        dest="mlflow_experiment",
        default=MLFLOW_EXPERIMENT,
        metavar="NAME",
        help=f"the MLflow experiment the sweep's runs are tracked in (default: {MLFLOW_EXPERIMENT})",
    )
    parser.add_argument(
        "--experiment",
        dest="mlflow_experiment",
        action=_DeprecatedSpelling,
        replacement=MLFLOW_EXPERIMENT_FLAG,
        help=argparse.SUPPRESS,
    )
