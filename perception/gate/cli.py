"""perception-gate --sweep-id ID [--sweep-id ID ...] [--tracking-uri URI] [--mlflow-experiment NAME] [--config NAME]
[--control ARM] [--treatment ARM] [--out DIR] [--decision-file PATH] [--json-file PATH] [--look K]
[--workflow-url URL] [gate.KEY=VALUE ...]

Decides the A/B of one sweep (DESIGN §7). Prints the decision as one JSON line on stdout.
Exit codes: 0 a decision was made (ship_<treatment>, keep_<control> or inconclusive), 3 refused
(the runs cannot be compared; the reasons say why), 2 usage error.

Several --sweep-id are decided one after another in one process, each as if alone (its own report
under --out/<sweep_id>, its own gate run, one JSON line each); the exit code is 3 if any was refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Optional

from perception.arms import DEFAULT_CONTROL, DEFAULT_TREATMENT
from perception.atomic import atomic_write_text
from perception.errors import ConfigError
from perception.exits import EXIT_USAGE, exit_code
from perception.mlflow_logs import no_artifact_bars
from perception.options import add_mlflow_experiment
from perception.paths import sweep_id_option

PROG = "perception-gate"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; this keeps the message one line
        self.print_usage(sys.stderr)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    p.add_argument(
        "--sweep-id",
        required=True,
        action="append",
        type=sweep_id_option,
        help="the sweep's id (tag sweep_id of its runs); repeat it to decide several one after another",
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite under PERCEPTION_HOME)",
    )
    add_mlflow_experiment(p)  # and --experiment, its former spelling, with a notice
    p.add_argument(
        "--config", default="default", help="conf/gate/<NAME>.yaml, or a path to such a file (default: default)"
    )
    p.add_argument("--control", default=DEFAULT_CONTROL, help=f"arm A (default: {DEFAULT_CONTROL})")
    p.add_argument("--treatment", default=DEFAULT_TREATMENT, help=f"arm B (default: {DEFAULT_TREATMENT})")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report folder (default: PERCEPTION_HOME/gate/<sweep_id>; with several ids, OUT/<sweep_id>)",
    )
    p.add_argument(
        "--decision-file",
        type=Path,
        default=None,
        help="write the decision word here (ship_<treatment> | keep_<control> | inconclusive | refused)",
    )
    p.add_argument(
        "--json-file",
        type=Path,
        default=None,
        help="write the JSON line here too (a workflow step's output: the decision, W, G, look)",
    )
    p.add_argument(
        "--look",
        type=int,
        default=None,
        metavar="K",
        help="a sequential study: decide at look K from replicates 0 … K-1 exactly (later waves are "
        "not read); refused when one of them is incomplete",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--workflow-url",
        default=os.environ.get("PERCEPTION_WORKFLOW_URL") or None,
        help="the Argo workflow's page, tagged `workflow_url` on the sweep's parent run "
        "(default: PERCEPTION_WORKFLOW_URL)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="gate.KEY=VALUE",
        help="override a value of the gate config, e.g. gate.alpha=0.01 'gate.weights={1000: 1.0}'",
    )
    return p


def _http_or_none(url: Optional[str]) -> Optional[str]:
    """A workflow rendered without the Argo UI's address passes a bare path: no link to tag."""
    return url if url and url.startswith(("http://", "https://")) else None


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    several = len(args.sweep_id) > 1
    for flag, value in (
        ("--decision-file", args.decision_file),
        ("--json-file", args.json_file),
        ("--look", args.look),
    ):
        if several and value is not None:
            parser.error(f"{flag} takes one --sweep-id; got {len(args.sweep_id)}")
    # Before MLflow is imported: one download bar per small artifact would bury the gate's output.
    no_artifact_bars()
    from perception.gate.run import run_gate  # imported late so --help and usage errors are instant

    codes = []
    for sweep_id in args.sweep_id:
        out = args.out / sweep_id if several and args.out is not None else args.out
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON lines
                outcome = run_gate(
                    sweep_id,
                    tracking_uri=args.tracking_uri,
                    experiment=args.mlflow_experiment,
                    config_name=args.config,
                    config_overrides=args.overrides,
                    out_dir=out,
                    decision_file=args.decision_file,
                    control=args.control,
                    treatment=args.treatment,
                    progress=not args.no_progress,
                    workflow_url=_http_or_none(args.workflow_url),
                    look=args.look,
                )
        except ConfigError as e:  # said as argparse says a usage error
            return exit_code(e, PROG, labels={ConfigError: "error"})
        for line in outcome.reasons:
            print(("refused: " if outcome.refused else "") + line, file=sys.stderr)
        for line in outcome.summary.get("running_ignored", []):
            print(f"ignored, still RUNNING: {line}", file=sys.stderr)
        print(f"report: {outcome.report_dir}", file=sys.stderr)
        line = json.dumps(outcome.json_line())
        if args.json_file is not None:
            atomic_write_text(args.json_file, line + "\n")
        print(line, flush=True)
        codes.append(outcome.exit_code)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
