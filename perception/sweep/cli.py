"""`perception-sweep`: the A/B on this machine, or as an Argo Workflow.

    perception-sweep local [--sweep-id ID] [--arms a,b[,c]] [--replicates R] [--aa] [overrides…]
                                                            the trainings here, then the gate
    perception-sweep local --design sequential [--max-replicates R] [...]
                                                            waves of replicates, the gate after each
    perception-sweep prepare --sweep-id ID [overrides…]     feature cache + parent run (workflow step)
    perception-sweep render [--smoke] [--out wf.yaml] [--check] [--list-parameters]   the Argo Workflow as YAML
    perception-sweep validate wf.yaml                       check a render against the strict Argo schema
    perception-sweep submit --host URL --namespace NS [--smoke] [-p name=value…] [--wait | --dry-run]
      (render and submit: -p design=sequential -p max-replicates=R, or --design sequential
      --max-replicates R, runs the sequential study's waves and looks on Argo)
    perception-sweep status NAME --host URL --namespace NS  the workflow, each step, the decision
    perception-sweep logs NAME [--task T] [-f] --host URL --namespace NS
    perception-sweep stop NAME --host URL --namespace NS    Argo's stop: exit handlers still run
      (the server commands: --host, --namespace, --secure=false, -k/--insecure also from ARGO_SERVER,
      ARGO_NAMESPACE, ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY, as the argo CLI reads them; token: ARGO_TOKEN)
    perception-sweep sync --sweep-id ID                     re-send metrics a run could not send
    perception-sweep ui [--sweep-id ID] [--mlflow-experiment NAME] [--port 5000]
                                                            the MLflow UI on a sweep's runs, folds side by side
    perception-sweep calibrate --experiment NAME [--sweeps N] [--cpu-workers K] [--out FILE | --into-package]
                               [--no-write] [overrides…]    A/A sweeps -> the gate's noise file for the Hydra
                                                            experiment NAME, under PERCEPTION_HOME

Exit codes: 0 success, 1 failed work (a training failed, the gate refused, the server said no),
2 usage or config error, or the sweep is in use by another `local` or `prepare` (its holder named),
130 interrupted (Ctrl-C), 143 terminated (SIGTERM): running trainings end KILLED first.
`validate`: 1 when a file does not validate.
`submit --wait` and `status` answer with the gate's decision instead: 0 a decision, 3 refused, 1 the
workflow ended without a decision, 124 `--wait` timed out (`status` of a workflow still running: 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from perception.atomic import atomic_write_text
from perception.errors import ConfigError, PerceptionError
from perception.exits import EXIT_DECIDED, EXIT_INTERRUPTED, EXIT_TIMED_OUT, exit_code, raise_on_sigterm
from perception.mlflow_logs import no_artifact_bars
from perception.options import add_mlflow_experiment
from perception.paths import sweep_id_option

PROG = "perception-sweep"
STOPPED = "re-run with the same --sweep-id to continue"


def _local(args: argparse.Namespace) -> int:
    from perception.sweep.local import run_local_sweep

    if args.cpu_workers < 1:
        raise ConfigError(f"--cpu-workers {args.cpu_workers}: expected 1 or more")
    result = run_local_sweep(args.sweep_id, args.overrides, design=_design(args), cpu_workers=args.cpu_workers)
    failed = [r.spec.label for r in result.runs if r.status == "failed"]
    gate = result.gate
    print(
        f"sweep {result.sweep_id}: {sum(r.status != 'failed' for r in result.runs)}/{len(result.runs)} runs "
        f"finished" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if gate.refused:
        print("decision: refused — " + "; ".join(gate.reasons))
    else:
        print(f"decision: {gate.decision}")
    for line in getattr(gate, "summary", {}).get("running_ignored", []):
        print(f"the gate ignored a training run still RUNNING: {line}")
    print(f"report: {gate.report_dir}")
    print(f"wall time: {result.wall_s:.1f} s ({result.wall_s / 60:.1f} min)")
    print(f"next: {ui_command(result.sweep_id, args.overrides)}   (the folds compared in the MLflow UI)")
    return result.exit_code


def ui_command(sweep_id: str, overrides: Sequence[str]) -> str:
    """The `perception-sweep ui` command that opens this sweep, on the store its overrides chose."""
    uri = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("tracking.uri=")]
    return f"perception-sweep ui --sweep-id {sweep_id}" + (f" --tracking-uri {uri[-1]}" if uri else "")


def _calibrate(args: argparse.Namespace) -> int:
    from perception.sweep.calibrate import calibrate

    if args.cpu_workers < 1:
        raise ConfigError(f"--cpu-workers {args.cpu_workers}: expected 1 or more")
    path = calibrate(
        args.experiment,
        args.sweeps,
        args.overrides,
        cpu_workers=args.cpu_workers,
        seed_base=args.seed_base,
        out=args.out,
        arms=tuple(args.arms.split(",")),
        write=not args.no_write,
        into_package=args.into_package,
    )
    print(f"noise file: {path}" if path is not None else "noise file: not written (--no-write)")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from perception.sweep.prepare import prepare

    parent = prepare(
        args.sweep_id,
        args.overrides,
        args.parent_run_id_file,
        design=_design(args),
        outputs=args.outputs,
        gate_config=args.gate_config,
        gpus=args.gpus,
    )
    print(parent)
    return 0


def _render(args: argparse.Namespace) -> int:
    from perception.sweep.render import parameters_markdown, render

    if args.list_parameters:
        sys.stdout.write(parameters_markdown(smoke=args.smoke))
        return 0
    text = render(smoke=args.smoke, params=_workflow_params(args))
    if args.check:
        import yaml

        from perception.sweep.schema import schema_errors

        errors = schema_errors(yaml.safe_load(text))
        if errors:
            raise PerceptionError(
                "the render does not validate against the Argo schema: "
                + "; ".join(f"{w}: {m[:200]}" for w, m in errors[:5])
            )
        print("Workflow OK (strict Argo v4.1.2 schema)", file=sys.stderr)
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from perception.sweep.schema import file_errors

    failed = 0
    for path in args.files:
        if not path.is_file():
            raise ConfigError(f"{path}: no such file (a render: perception-sweep render --out {path})")
        problems = file_errors(path)
        for line in problems:
            print(line)
        if not problems:
            print(f"{path}: Workflow OK (strict Argo v4.1.2 schema)")
        failed += bool(problems)
    return 1 if failed else 0


def _submit(args: argparse.Namespace) -> int:
    import json

    from perception.sweep.submit import dry_run, submit

    if args.poll_interval <= 0 or (args.timeout is not None and args.timeout <= 0):
        raise ConfigError(f"--poll-interval {args.poll_interval:g} / --timeout {args.timeout}: expected seconds > 0")
    if args.dry_run:
        if args.wait:
            raise ConfigError("--dry-run posts nothing, so there is nothing to --wait for: drop one of them")
        shown = dry_run(_target(args, required=False), smoke=args.smoke, params=_workflow_params(args))
        print(json.dumps(shown.body, indent=2))
        where = f"POST {shown.url}" if shown.url else "no server named (--host or ARGO_SERVER)"
        print(f"dry run: validated strictly; would {where}; nothing sent", file=sys.stderr)
        return 0
    done = submit(_target(args), smoke=args.smoke, params=_workflow_params(args))
    print(f"submitted {done.name} to namespace {done.namespace}", flush=True)
    print(done.link, flush=True)
    if not args.wait:
        return 0
    return _wait(_server(args), done.name, args.poll_interval, args.timeout)


def _wait(server, name: str, poll_interval: float, timeout: Optional[float]) -> int:
    from perception.sweep import follow

    try:
        waited = follow.wait(lambda: server.get(name), poll_interval, timeout, lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print(
            f"{PROG}: stopped following; {name} keeps running: perception-sweep status {name} "
            f"--host {server.host} --namespace {server.namespace}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if waited.last is None:
        print(f"{PROG}: the Argo server never answered about {name} within {timeout:g} s", file=sys.stderr)
        return EXIT_TIMED_OUT
    s = waited.last
    code = follow.outcome(s)
    if waited.timed_out:
        print(
            f"timed out after {timeout:g} s; {name} is {s.phase}: "
            f"perception-sweep status {name} --host {server.host} --namespace {server.namespace}"
        )
        code = EXIT_TIMED_OUT
    else:
        print(
            f"decision: {s.decision or 'none'}"
            + ("" if s.decision else f" ({name} {s.phase}" + (f": {s.message})" if s.message else ")"))
        )
    for line in follow.summary_lines(s, server.link(name)):
        print(line)
    assert code is not None  # the workflow finished, or the wait timed out
    return code


def _status(args: argparse.Namespace) -> int:
    from perception.sweep import follow

    server = _server(args)
    s = follow.snapshot(_get(server, args.name))
    for line in follow.status_lines(s) + follow.summary_lines(s, server.link(args.name)):
        print(line)
    code = follow.outcome(s)
    return EXIT_DECIDED if code is None else code  # still running: 0


def _logs(args: argparse.Namespace) -> int:
    from perception.sweep.logs import print_logs

    server = _server(args)
    _get(server, args.name)  # a wrong name is a usage error, before any stream
    print_logs(server, args.name, args.task, args.follow, lambda line: print(line, flush=True))
    return 0


def _stop(args: argparse.Namespace) -> int:
    server = _server(args)
    _get(server, args.name)
    server.stop(args.name, args.message)
    print(
        f"stopping {args.name}: running steps end, exit handlers still run; "
        f"follow with: perception-sweep status {args.name} --host {server.host} --namespace {server.namespace}"
    )
    return 0


def _get(server, name: str):
    """The workflow; a name the server does not know is a usage error (exit 2)."""
    from perception.sweep.argo_api import ArgoError

    try:
        return server.get(name)
    except ArgoError as exc:
        if exc.status == 404:
            raise ConfigError(
                f"NAME {name!r}: no such workflow in namespace {server.namespace!r} at "
                f"{server.host} (names as `submit` printed them, e.g. ab-sweep-x7k2p)"
            ) from exc
        raise


def _server(args: argparse.Namespace):
    from perception.sweep.argo_api import ArgoServer

    return ArgoServer(_target(args))


def _target(args: argparse.Namespace, required: bool = True):
    """The server from the options, else the argo CLI's environment variables; plain http only when
    asked for, and said so."""
    from perception.sweep.argo_options import resolve

    target = resolve(args.host, args.namespace, args.secure, args.insecure)
    if target is None and required:
        raise ConfigError(
            "no Argo server: pass --host (e.g. --host https://argo.example.com) or set ARGO_SERVER=host:port"
        )
    if target is not None and target.plain_http:
        print(
            f"{PROG}: warning: plain http: the bearer token goes to {target.host} unencrypted "
            f"(asked for with --secure=false or ARGO_SECURE=false)",
            file=sys.stderr,
        )
    return target


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


def _ui(args: argparse.Namespace) -> int:
    from perception.paths import perception_home, tracking_uri
    from perception.sweep import ui
    from perception.tracking import client

    uri = tracking_uri(args.tracking_uri)
    view = ui.prepare_view(client(uri), args.mlflow_experiment, args.sweep_id)
    base, server = uri, None  # a tracking server is its own UI
    if not ui.is_server(uri):
        base, log = f"http://{args.host}:{args.port}", perception_home() / "mlflow-ui.log"
        server = ui.serve(uri, args.host, args.port, perception_home() / "mlartifacts", log)
    deciding = ", ".join(f"h{h}" for h in view.deciding)
    print(
        f"sweep {view.sweep_id}: columns "
        + ", ".join(
            [
                *(f"val_auc_h{h}" for h in view.deciding),
                "variant",
                "fold",
                "replicate",
                *(f"val_auc_h{h}" for h in view.horizons if h not in view.deciding),
                "val_auc_mean",
            ]
        )
        + (f" (the deciding horizon{'s' if len(view.deciding) > 1 else ''} {deciding} first)" if deciding else ""),
        flush=True,
    )
    print(f"open first: {view.url(base, 'fold')}", flush=True)
    print(f"grouped by fold (each fold's arms side by side): {view.url(base, 'fold')}", flush=True)
    print(f"grouped by variant (a group row: the arm's mean over folds): {view.url(base, 'variant')}", flush=True)
    if view.comparison_url(base):
        print(
            f"per-fold tables (A, B, B − A per horizon) and auc_by_horizon.png: {view.comparison_url(base)}", flush=True
        )
    print(f"filter: {view.search_filter}", flush=True)
    if server is None:
        print(f"the MLflow UI of {uri}", flush=True)
        return 0
    print(f"the MLflow UI serves {uri} at {base} (log {log}); Ctrl-C stops it", flush=True)
    try:
        return server.wait()  # it ended on its own: its exit code
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: how the UI is closed
        print("the MLflow UI stopped", flush=True)
        return 0
    finally:
        ui.stop(server)


def _params(items: Optional[list[str]]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"-p {item!r}: expected name=value, e.g. -p tag=v1.2.0")
        out[name] = value
    return out


def _workflow_params(args: argparse.Namespace) -> dict[str, str]:
    """render/submit: the design flags and --sweep-id as workflow parameters; -p wins over both. The
    design they make together is checked here, as prepare will check it in its pod."""
    from perception.sweep.design import Design, replicates_flag

    sweep = {"sweep-id": args.sweep_id} if args.sweep_id else {}
    params = {**_design_params(args), **sweep, **_params(args.param)}
    counts = {}
    for name in ("replicates", "max-replicates"):  # only those given: the workflow's defaults fill the rest
        value = params.get(name)
        if value is not None and not value.strip().isdigit():
            raise ConfigError(f"-p {name}={value!r}: expected a whole number, 1 or more")
        counts[name] = None if value is None else int(value)
    kind = params.get("design", "fixed")
    n = replicates_flag(kind, counts["replicates"], counts["max-replicates"])  # the flags name -p's too
    Design.of(
        params.get("arms") or None,
        n,
        params.get("aa") == "true",
        params.get("control") or None,
        params.get("treatment") or None,
        kind,
    )
    return params


def _design_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--arms", help="arms to train, e.g. shared,per_horizon,shared_skip (default: shared,per_horizon)")
    s.add_argument("--replicates", type=int, default=None, help="seed replicates per arm and fold (default 1)")
    s.add_argument(
        "--aa",
        nargs="?",
        const="true",
        default=None,
        choices=["true", "false"],
        help="A/A test: the control against its twin (another seed for the pool query and heads)",
    )
    s.add_argument("--control", help="the gate's arm A (default: shared)")
    s.add_argument("--treatment", help="the gate's arm B (default: per_horizon)")


def _sequential_options(s: argparse.ArgumentParser, default: Optional[str] = "fixed") -> None:
    s.add_argument(
        "--design",
        choices=["fixed", "sequential"],
        default=default,
        help="fixed: every replicate, then the gate once (takes --replicates); sequential: waves of "
        "one replicate each, the gate after every wave, stop when it settles (takes --max-replicates)",
    )
    s.add_argument(
        "--max-replicates", type=int, default=None, help="--design sequential: the most waves it may train (default 3)"
    )


def _design(args: argparse.Namespace):
    from perception.sweep.design import Design, replicates_flag

    kind = getattr(args, "design", None) or "fixed"
    replicates = replicates_flag(kind, args.replicates, getattr(args, "max_replicates", None))
    return Design.of(args.arms, replicates, args.aa == "true", args.control, args.treatment, kind)


def _design_params(args: argparse.Namespace) -> dict[str, str]:
    """The design flags of render/submit as workflow parameters (checked here, before anything is posted)."""
    _design(args)
    named = {
        "arms": args.arms,
        "replicates": None if args.replicates is None else str(args.replicates),
        "aa": args.aa,
        "control": args.control,
        "treatment": args.treatment,
        "design": args.design,
        "max-replicates": None if args.max_replicates is None else str(args.max_replicates),
    }
    return {k: v for k, v in named.items() if v is not None}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Run the SharedQuery vs PerHorizon A/B.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("local", help="run the trainings (arms x folds x replicates) here, then the gate")
    s.add_argument("--sweep-id", type=sweep_id_option, help="resume this sweep (default: a new id)")
    s.add_argument(
        "--cpu-workers",
        type=int,
        default=1,
        help="without GPUs, train this many runs side by side, one core each (default 1)",
    )
    _design_options(s)
    _sequential_options(s)
    s.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. experiment=ci")
    s.set_defaults(run=_local)

    s = sub.add_parser("prepare", help="fill the feature cache and create the parent run (workflow step)")
    s.add_argument("--sweep-id", type=sweep_id_option, required=True)
    s.add_argument("--parent-run-id-file", type=Path, help="also write the parent run id here")
    s.add_argument(
        "--outputs",
        type=Path,
        help="write the step's output parameters here (parent-run-id, runs, wave, aheads, control, treatment, "
        "gate-config, precision, ssd)",
    )
    s.add_argument(
        "--gpus",
        type=int,
        default=6,
        help="the GPUs the trainings share: a sequential wave's idle ones train the next wave's first (default 6)",
    )
    s.add_argument(
        "--gate-config", default="auto", help="conf/gate/<name>.yaml for the plan; auto: the experiment's (default)"
    )
    _design_options(s)
    _sequential_options(s)
    s.add_argument("overrides", nargs="*")
    s.set_defaults(run=_prepare)

    for name, helptext in (
        ("render", "print the Argo Workflow as YAML"),
        ("submit", "submit the Argo Workflow (token from ARGO_TOKEN)"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--smoke", action="store_true", help="experiment ci on CPU pods: minutes, no GPU")
        _design_options(s)
        _sequential_options(s, default=None)  # the same as -p design=… -p max-replicates=…
        s.add_argument(
            "--sweep-id",
            type=sweep_id_option,
            help="continue this sweep: finished runs are skipped, unfinished ones resume "
            "(the same as -p sweep-id=ID; default: a new sweep)",
        )
        s.add_argument(
            "-p",
            "--param",
            action="append",
            metavar="NAME=VALUE",
            help="workflow parameter, e.g. -p tag=v1.2.0 -p epochs=10",
        )
        if name == "render":
            s.add_argument("--out", type=Path, help="write here instead of stdout")
            s.add_argument(
                "--check",
                action="store_true",
                help="validate the render against the strict Argo schema first (exit 1 if it does not)",
            )
            s.add_argument(
                "--list-parameters",
                action="store_true",
                help="print the workflow's parameters (name, default, meaning) as a Markdown table",
            )
            s.set_defaults(run=_render)
        else:
            _server_options(s)
            s.add_argument(
                "--dry-run",
                action="store_true",
                help="render, validate strictly and print the request body that would be posted; "
                "send nothing (no server or token needed)",
            )
            s.add_argument(
                "--wait",
                action="store_true",
                help="follow the workflow to its end; exit with the gate's decision (see Exit codes)",
            )
            s.add_argument(
                "--poll-interval",
                type=float,
                default=30.0,
                metavar="S",
                help="seconds between polls with --wait (default 30)",
            )
            s.add_argument("--timeout", type=float, metavar="S", help="give up waiting after S seconds (exit 124)")
            s.set_defaults(run=_submit)

    s = sub.add_parser(
        "validate", help="check rendered workflow files against the strict Argo schema (exit 1 naming every problem)"
    )
    s.add_argument("files", nargs="+", type=Path, metavar="FILE", help="e.g. wf.yaml from perception-sweep render")
    s.set_defaults(run=_validate)

    s = sub.add_parser("status", help="a submitted sweep: phase, progress, each step, the decision")
    s.add_argument("name", help="the workflow's name, as submit printed it")
    _server_options(s)
    s.set_defaults(run=_status)

    s = sub.add_parser("logs", help="the pods' logs of a submitted sweep")
    s.add_argument("name", help="the workflow's name")
    s.add_argument(
        "--task",
        help="one step: a training (shared-f0), prepare, gate, a sequential study's look (look-2); or a template "
        "(train, look)",
    )
    s.add_argument("-f", "--follow", action="store_true", help="keep streaming while the pods run")
    _server_options(s)
    s.set_defaults(run=_logs)

    s = sub.add_parser("stop", help="stop a submitted sweep (Argo's stop: exit handlers still run)")
    s.add_argument("name", help="the workflow's name")
    s.add_argument("--message", default="", help="recorded as the reason in the workflow's status")
    _server_options(s)
    s.set_defaults(run=_stop)

    s = sub.add_parser(
        "calibrate",
        help="measure an experiment's training noise with A/A sweeps and write the "
        "noise file the one-replicate gate uses",
    )
    s.add_argument(
        "--experiment",
        required=True,
        metavar="NAME",
        help="the Hydra experiment to measure (conf/experiment/NAME.yaml), e.g. production",
    )
    s.add_argument("--sweeps", type=int, default=5, help="A/A sweeps per seed arm (default 5: 15 cells an arm)")
    s.add_argument(
        "--cpu-workers",
        type=int,
        default=1,
        help="without GPUs, train this many runs side by side, one core each (default 1)",
    )
    s.add_argument("--seed-base", type=int, default=90_000, help="the first sweep's seed (default 90000)")
    s.add_argument(
        "--arms",
        default="shared,per_horizon",
        help="the seed arms to twin (default shared,per_horizon; the gate uses the widest measured)",
    )
    where = s.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        type=Path,
        help="write the noise file here (default: "
        "$PERCEPTION_HOME/noise/<experiment>.json, which the gate reads "
        "before the shipped files)",
    )
    where.add_argument(
        "--into-package",
        action="store_true",
        help="write the shipped file, perception/gate/noise/<experiment>.json in the installed "
        "package (for maintainers refreshing the files the package ships)",
    )
    s.add_argument(
        "--no-write",
        action="store_true",
        help="train and decide the A/A sweeps only; a later call without it writes the file from "
        "them all (the workflow runs one sweep a pod)",
    )
    s.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides for every run (the file matches only runs made with the same epochs and data scale)",
    )
    s.set_defaults(run=_calibrate)

    s = sub.add_parser(
        "ui",
        help="open the MLflow UI on a sweep's training runs: prints the runs view's URLs "
        "(grouped by variant, by fold); starts the UI for a local store",
    )
    s.add_argument("--sweep-id", type=sweep_id_option, help="the sweep (default: the latest)")
    s.add_argument(
        "--tracking-uri",
        help="default: MLFLOW_TRACKING_URI, else $PERCEPTION_HOME/mlflow.db; a "
        "server's URL is pointed at, a local store is served",
    )
    add_mlflow_experiment(s)  # and --experiment, its former spelling, with a notice
    s.add_argument("--host", default="127.0.0.1", help="where a local store's UI listens (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=5000, help="its port (default 5000)")
    s.set_defaults(run=_ui)

    s = sub.add_parser("sync", help="re-send tracking data runs could not send")
    s.add_argument("--sweep-id", type=sweep_id_option, required=True)
    s.add_argument("--tracking-uri")
    s.set_defaults(run=_sync)
    return p


def _server_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--host",
        help="the Argo server: https://argo.example.com, or host:port as the argo CLI takes it (default: ARGO_SERVER)",
    )
    s.add_argument("--namespace", help="default: ARGO_NAMESPACE, else perception")
    s.add_argument(
        "--secure",
        nargs="?",
        const="true",
        metavar="BOOL",
        help="--secure=false: plain http, the token sent unencrypted (default: ARGO_SECURE, else true)",
    )
    s.add_argument(
        "-k",
        "--insecure",
        "--insecure-skip-verify",
        dest="insecure",
        action="store_true",
        help="TLS without checking the server's certificate (default: ARGO_INSECURE_SKIP_VERIFY)",
    )


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parser().parse_args(argv)
    no_artifact_bars()  # the gate's downloads, in this process: the terminal shows the sweep's own lines
    raise_on_sigterm()  # SIGTERM reaches the sweep as Terminated: it ends its trainings and parent run first
    try:
        code = args.run(args)
    except (PerceptionError, KeyboardInterrupt) as exc:  # a sweep held by another process exits 2
        code = exit_code(exc, PROG, stopped=STOPPED)
    sys.exit(code)


if __name__ == "__main__":
    main()
