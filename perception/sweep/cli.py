"""`perception-sweep`: the A/B on this machine, or as an Argo Workflow.

    perception-sweep local [--sweep-id ID] [overrides…]     six trainings here, then the gate
    perception-sweep prepare --sweep-id ID [overrides…]     feature cache + parent run (workflow step)
    perception-sweep render [--smoke] [--out wf.yaml]       the Argo Workflow as YAML
    perception-sweep submit --host URL --namespace NS [--smoke] [-p name=value…]   (token: ARGO_TOKEN)
    perception-sweep sync --sweep-id ID                     re-send metrics a run could not send

Exit codes: 0 success, 1 failed work (a training failed, the gate refused, the server said no),
2 usage or config error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from perception.atomic import atomic_write_text
from perception.errors import ConfigError, PerceptionError

PROG = "perception-sweep"


def _local(args: argparse.Namespace) -> int:
    from perception.sweep.local import run_local_sweep

    result = run_local_sweep(args.sweep_id, args.overrides)
    failed = [r.spec.label for r in result.runs if r.status == "failed"]
    gate = result.gate
    print(f"sweep {result.sweep_id}: {sum(r.status != 'failed' for r in result.runs)}/{len(result.runs)} runs "
          f"finished" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if gate.refused:
        print("decision: refused — " + "; ".join(gate.reasons))
    else:
        print(f"decision: {gate.decision}")
    print(f"report: {gate.report_dir}")
    print(f"wall time: {result.wall_s:.1f} s ({result.wall_s / 60:.1f} min)")
    return result.exit_code


def _prepare(args: argparse.Namespace) -> int:
    from perception.sweep.local import prepare

    parent = prepare(args.sweep_id, args.overrides, args.parent_run_id_file)
    print(parent)
    return 0


def _render(args: argparse.Namespace) -> int:
    from perception.sweep.render import render

    text = render(smoke=args.smoke, params=_params(args.param))
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _submit(args: argparse.Namespace) -> int:
    from perception.sweep.submit import submit

    done = submit(args.host, args.namespace, smoke=args.smoke, params=_params(args.param),
                  verify_ssl=not args.insecure)
    print(f"submitted {done.name} to namespace {done.namespace}")
    print(done.link)
    return 0


def _sync(args: argparse.Namespace) -> int:
    from perception.paths import tracking_uri
    from perception.tracking import replay_unsent

    try:
        sent = replay_unsent(args.sweep_id, tracking_uri=tracking_uri(args.tracking_uri))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from exc
    except RuntimeError as exc:
        raise PerceptionError(str(exc)) from exc
    print(f"sweep {args.sweep_id}: sent {sent} pending tracking operation(s)")
    return 0


def _params(items: Optional[list[str]]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"-p {item!r}: expected name=value, e.g. -p tag=v1.2.0")
        out[name] = value
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Run the SharedQuery vs PerHorizon A/B.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("local", help="run the six trainings on this machine, then the gate")
    s.add_argument("--sweep-id", help="resume this sweep (default: a new id)")
    s.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. experiment=ci")
    s.set_defaults(run=_local)

    s = sub.add_parser("prepare", help="fill the feature cache and create the parent run (workflow step)")
    s.add_argument("--sweep-id", required=True)
    s.add_argument("--parent-run-id-file", type=Path, help="also write the parent run id here")
    s.add_argument("overrides", nargs="*")
    s.set_defaults(run=_prepare)

    for name, helptext in (("render", "print the Argo Workflow as YAML"),
                           ("submit", "submit the Argo Workflow (token from ARGO_TOKEN)")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--smoke", action="store_true", help="experiment ci on CPU pods: minutes, no GPU")
        s.add_argument("-p", "--param", action="append", metavar="NAME=VALUE",
                       help="workflow parameter, e.g. -p tag=v1.2.0 -p epochs=10")
        if name == "render":
            s.add_argument("--out", type=Path, help="write here instead of stdout")
            s.set_defaults(run=_render)
        else:
            s.add_argument("--host", required=True, help="Argo server URL, e.g. https://argo.example.com")
            s.add_argument("--namespace", default="perception")
            s.add_argument("--insecure", action="store_true", help="skip TLS verification")
            s.set_defaults(run=_submit)

    s = sub.add_parser("sync", help="re-send tracking data runs could not send")
    s.add_argument("--sweep-id", required=True)
    s.add_argument("--tracking-uri")
    s.set_defaults(run=_sync)
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.run(args)
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        code = 2
    except PerceptionError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; re-run with the same --sweep-id to continue", file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
