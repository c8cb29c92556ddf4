"""The A/B sweep as an Argo Workflow (DESIGN §7): prepare >> trainings (fanned out) >> gate.

    hera generate yaml workflows/ab_sweep.py          # the study on L40S pods
    perception-sweep render [--smoke] [--out wf.yaml] # the same, or the CPU smoke variant
    perception-sweep submit --host https://argo.example.com --namespace perception

`prepare` fills the feature cache on a ReadWriteMany PVC, creates the sweep's parent MLflow run with
its pre-registered gate plan, and lists the trainings (arms x folds x replicates, from the `arms`,
`replicates` and `aa` parameters) that the `train` task fans out over (withParam), so `-p arms=...`
changes the fan-out at submit time; each (arm, fold, replicate) trains in its own pod and resumes from its PVC
checkpoint after a preemption;
the gate runs whatever the trainings' outcome, so a missing run becomes a refusal with a reason.
Every training runs at the precision, SSD and VSN form prepare outputs: the ones the sweep started with (its
parent run's tags `trainer.precision`, `model.mamba.ssd`, `model.mamba.chunk`, `model.vsn.fold_embed` and
`model.vsn.fused_grn`), so a sweep continued after the experiment's defaults changed keeps its own.
Only run ids travel between steps; metrics stay in MLflow.

With `-p calibrate=true` the experiment's training noise is measured first (`perception-sweep calibrate`):
the A/A sweeps (each seed arm against its twin, CALIBRATION_SWEEPS seeds) fan out one pod each, then one
CPU pod decides them again (nothing left to train) and writes the noise file to NOISE_DIR on the runs
PVC, where this and every later workflow's gate reads it before the shipped files.
"""

from __future__ import annotations

from typing import Sequence

from hera.workflows import (
    DAG,
    ConfigMapEnvFrom,
    Container,
    EmptyDirVolume,
    Env,
    ExistingVolume,
    Parameter,
    ResourceEnv,
    Resources,
    RetryStrategy,
    SecretEnvFrom,
    Task,
    Workflow,
)
from hera.workflows.models import (
    Backoff,
    Capabilities,
    ContinueOn,
    LabelValueFrom,
    PodGC,
    PodSecurityContext,
    SeccompProfile,
    SecurityContext,
    Toleration,
    TTLStrategy,
    ValueFrom,
    WorkflowMetadata,
)

# A literal, so `hera generate yaml` runs this file without the package; a test checks it against
# perception.arms.DEFAULT_ARMS.
VARIANTS = ("shared", "per_horizon")
# perception-sweep calibrate's defaults (seed arms, --sweeps, --seed-base), literal for the same reason.
CALIBRATION_ARMS = VARIANTS
CALIBRATION_SWEEPS = 5
CALIBRATION_SEED_BASE = 90_000

# Cluster names shared with the manifests in infra/.
NAMESPACE = "perception"
SERVICE_ACCOUNT = "perception-workflow"
CONFIG_MAP = "perception-config"  # MLFLOW_TRACKING_URI, PERCEPTION_HOME
CREDENTIALS_SECRET = "mlflow-credentials"  # MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD
GPU_PRODUCT = "NVIDIA-L40S"

# The sweep a workflow works on: its `sweep-id` parameter (an earlier sweep's id continues that sweep),
# else its own name. An Argo expression, so a resubmission from the Argo UI resolves it the same way.
# What a sweep keeps from its start: config key -> the parameter prepare outputs it as; every training appends
# it as its config key. A literal, as VARIANTS; a test checks it against perception.sweep.pins.PARAMETERS.
PINNED = {
    "trainer.precision": "precision",
    "model.mamba.ssd": "ssd",
    "model.vsn.fold_embed": "fold-embed",
    "model.mamba.chunk": "chunk",
    "model.vsn.fused_grn": "fused-grn",
}
PINNED_PARAMETERS = tuple(PINNED.values())
SWEEP_ID_EXPR = 'workflow.parameters["sweep-id"] != "" ? workflow.parameters["sweep-id"] : workflow.name'
SWEEP_ID = "{{=" + SWEEP_ID_EXPR + "}}"
SWEEP_ID_LABEL = "perception/sweep-id"  # `submit` refuses a second running workflow on one sweep
OUTPUTS = "/tmp/prepare"  # prepare's output parameters, one file each
DECISION_FILE = "/tmp/decision"
GATE_LINE_FILE = "/tmp/gate.json"  # a look's JSON line (decision, W, G, look), read by `perception-sweep status`
# prepare takes --replicates for the fixed design and --max-replicates for the sequential one, never both
# wave r's `ahead` items: aheads[r] (Argo's expression functions `jsonpath` and `toJson`)
AHEAD_ITEMS = "{{=toJson(jsonpath(inputs.parameters.aheads, '$[' + inputs.parameters.replicate + ']'))}}"
REPLICATES_FLAG = (
    '{{=workflow.parameters.design == "sequential" ? "--max-replicates=" + '
    'workflow.parameters["max-replicates"] : "--replicates=" + workflow.parameters.replicates}}'
)
GATE_REPORT_DIR = "/perception-home/runs/" + SWEEP_ID + "/gate"  # on the runs PVC, beside the runs
# Measured noise files on the runs PVC: calibrate writes here, the gate reads here first
# (perception.gate.noise.NOISE_DIR_ENV).
NOISE_DIR = "/perception-home/runs/noise"
NOISE_ENV = [Env(name="PERCEPTION_GATE_NOISE_DIR", value=NOISE_DIR)]

# Every container runs with a read-only root filesystem, so what the steps and their libraries write
# goes to per-pod scratch volumes (emptyDir), each bounded so a runaway writer evicts only its own pod:
#   /tmp            tempfile (the gate's downloaded predictions, the data build's spill), prepare's and
#                   the gate's output files, Inductor's cache (/tmp/torchinductor_<user>)
#   HOME            Triton's kernel cache (~/.triton), matplotlib's config and font cache
#                   (~/.config/matplotlib, ~/.cache), torch's and CUDA's JIT caches (~/.cache, ~/.nv)
#   PERCEPTION_HOME Hydra's own output (hydra/, hydra-multirun/); its cache/ and runs/ are the claims
#                   mounted on top, which is all that outlives the pod
HOME = "/home/perception"  # the image's HOME (Dockerfile)
PERCEPTION_HOME = "/perception-home"  # the ConfigMap's PERCEPTION_HOME
SCRATCH = (("tmp", "/tmp", "8Gi"), ("home", HOME, "4Gi"), ("perception-home", PERCEPTION_HOME, "1Gi"))
CONTAINER_SECURITY = SecurityContext(
    allow_privilege_escalation=False,
    capabilities=Capabilities(drop=["ALL"]),
    read_only_root_filesystem=True,
    run_as_non_root=True,
    seccomp_profile=SeccompProfile(type="RuntimeDefault"),
)
# Thread pools sized to the container's CPU limit rather than the node's cores (torch, OpenMP and
# BLAS read OMP_NUM_THREADS; Inductor's compile workers TORCHINDUCTOR_COMPILE_THREADS): a pool as wide
# as a 64-core node under an 8-CPU quota spends the step throttled. The Downward API rounds the limit
# up to whole cores.
THREAD_ENV = [
    ResourceEnv(name=name, resource="limits.cpu", divisor="1")
    for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
]

# Spot preemption ends a pod as Failed ("imminent node shutdown") or Errored ("pod deleted");
# a real training failure (exit 1) or a config error (exit 2) is not retried.
PREEMPTED = 'lastRetry.message contains "imminent node shutdown" || lastRetry.message contains "pod deleted"'


def _params(smoke: bool) -> list[Parameter]:
    """The workflow's parameters; each description is shown in the Argo UI and listed in README
    (`perception-sweep render --list-parameters`)."""
    return [
        Parameter(name="image", value="ghcr.io/perception-platform/perception", description="the training image"),
        Parameter(name="tag", value="latest", description="its tag"),
        Parameter(
            name="experiment",
            value="ci" if smoke else "production",
            description="conf/experiment/NAME.yaml: the scale every step runs at",
        ),
        Parameter(name="epochs", value="2" if smoke else "30", description="epochs per training"),
        Parameter(
            name="data",
            value="synthetic",
            enum=["synthetic", "dbn"],
            description="synthetic books, or DBN files from data-paths",
        ),
        Parameter(
            name="data-paths",
            value="[]",
            description="DBN inputs under the read-only market-data mount, e.g. [/data/ES/*.dbn.zst]",
        ),
        Parameter(
            name="gate-config",
            value="auto",
            description="conf/gate/NAME.yaml; auto: the experiment's own (its horizons match)",
        ),
        Parameter(
            name="sweep-id",
            value="",
            description="empty: a new sweep named after the workflow; an earlier sweep's id continues it "
            "(finished runs skipped, unfinished ones resumed from their checkpoints)",
        ),
        Parameter(
            name="argo-ui",
            value="",
            description="the Argo UI's base URL; `perception-sweep submit` sets it, so the gate tags the "
            "sweep's parent run with this workflow's page",
        ),
        Parameter(
            name="arms", value=",".join(VARIANTS), description="the arms to train, e.g. shared,per_horizon,shared_skip"
        ),
        Parameter(name="replicates", value="1", description="seed replicates per arm and fold"),
        Parameter(
            name="design",
            value="fixed",
            enum=["fixed", "sequential"],
            description="fixed: every replicate, then the gate once; sequential: waves of one replicate "
            "each, the gate after every wave, stopping at the first look it settles",
        ),
        Parameter(
            name="max-replicates",
            value="3",
            description="design=sequential: the most waves it may train (replicates is then unused)",
        ),
        Parameter(
            name="gpus",
            value="6",
            description="design=sequential: the GPUs the trainings share; a wave's idle ones train the next "
            "wave's first trainings",
        ),
        Parameter(
            name="aa",
            value="false",
            enum=["false", "true"],
            description="true: the A/A test, the control against its twin",
        ),
        Parameter(name="control", value="", description="the gate's arm A; empty: shared"),
        Parameter(name="treatment", value="", description="the gate's arm B; empty: per_horizon (with aa: the twin)"),
        Parameter(
            name="calibrate",
            value="false",
            enum=["false", "true"],
            description="true: measure the experiment's training noise (A/A sweeps) and write its noise "
            "file before the A/B",
        ),
    ]


def shared_overrides() -> list[str]:
    """The Hydra overrides every step shares, so all of them read the same feature cache."""
    p = "{{workflow.parameters.%s}}"
    return [f"experiment={p % 'experiment'}", *_scale_overrides()]


def _scale_overrides() -> list[str]:
    """The shared overrides but the experiment (calibrate takes it as --experiment): the noise file
    matches only runs made at the same epochs and data."""
    p = "{{workflow.parameters.%s}}"
    return [f"trainer.epochs={p % 'epochs'}", f"data={p % 'data'}", f"data.paths={p % 'data-paths'}"]


def calibration_items() -> list[dict[str, str]]:
    """One A/A sweep per pod: the seed arm and its seed, as `perception-sweep calibrate` numbers them."""
    return [
        {"arm": arm, "seed": str(CALIBRATION_SEED_BASE + k)}
        for arm in CALIBRATION_ARMS
        for k in range(CALIBRATION_SWEEPS)
    ]


def _volumes(cache: bool = True, runs: bool = True, data: bool = True) -> list[ExistingVolume]:
    """ReadWriteMany claims, mounted per template (a workflow-level mount_path is silently dropped)."""
    vols = []
    if cache:
        vols.append(ExistingVolume(name="cache", claim_name="perception-cache", mount_path="/perception-home/cache"))
    if runs:
        vols.append(ExistingVolume(name="runs", claim_name="perception-runs", mount_path="/perception-home/runs"))
    if data:
        vols.append(
            ExistingVolume(name="market-data", claim_name="perception-market-data", mount_path="/data", read_only=True)
        )
    return vols


def _scratch() -> list[EmptyDirVolume]:
    return [EmptyDirVolume(name=name, mount_path=path, size_limit=size) for name, path, size in SCRATCH]


def _retry(limit: int) -> RetryStrategy:
    return RetryStrategy(
        limit=limit,
        retry_policy="Always",
        expression=PREEMPTED,
        backoff=Backoff(duration="30s", factor=2, max_duration="30m"),
    )


def _container(
    name: str,
    command: str,
    args: list[str],
    resources: Resources,
    volumes: list[ExistingVolume],
    retries: int = 3,
    env: Sequence[Env] = (),
    **kw,
) -> Container:
    return Container(
        name=name,
        image="{{workflow.parameters.image}}:{{workflow.parameters.tag}}",
        command=[command],
        args=args,
        env=[*env, *THREAD_ENV],
        env_from=[ConfigMapEnvFrom(name=CONFIG_MAP), SecretEnvFrom(name=CREDENTIALS_SECRET)],
        resources=resources,
        security_context=CONTAINER_SECURITY,
        volumes=[*_scratch(), *volumes],  # parents first: /perception-home before its claims
        retry_strategy=_retry(limit=retries),
        **kw,
    )


def _gate(
    name: str = "gate",
    extra_args: Sequence[str] = (),
    inputs: Sequence[Parameter] = (),
    outputs: Sequence[Parameter] = (),
) -> Container:
    """The gate on a CPU pod: decides the sweep and ends its parent run (DESIGN §7)."""
    return _container(
        name,
        "perception-gate",
        [
            "--sweep-id",
            SWEEP_ID,
            "--config",
            "{{inputs.parameters.gate-config}}",
            "--control",
            "{{inputs.parameters.control}}",
            "--treatment",
            "{{inputs.parameters.treatment}}",
            "--decision-file",
            DECISION_FILE,
            *extra_args,
            "--out",
            GATE_REPORT_DIR,
            "--no-progress",
            "--workflow-url",
            "{{workflow.parameters.argo-ui}}workflows/{{workflow.namespace}}/{{workflow.name}}",
        ],
        Resources(cpu_request=2, cpu_limit=2, memory_request="4Gi", memory_limit="8Gi"),
        inputs=[Parameter(name="control"), Parameter(name="treatment"), Parameter(name="gate-config"), *inputs],
        volumes=_volumes(cache=False, data=False),
        env=NOISE_ENV,
        outputs=list(outputs),
    )


def _wave(train: Container, look: Container) -> DAG:
    """One wave of a sequential study (DESIGN §7), recursive: its trainings (every arm and fold at replicate
    r), then the gate at look r + 1 whatever their outcome (a failed one makes the look refuse), then wave
    r + 1 only when that look's decision is `continue` and r + 1 < max-replicates. A refused or final look
    ends the recursion, so no later wave trains. Beside its trainings a wave trains the next wave's first
    ones on the GPUs its last round leaves idle (`ahead`, prepare's `aheads[r]`, empty where there are none):
    the look reads only its own waves, the next wave finds them finished (a pod that exits at once), and
    after a stop they stay as finished runs."""
    wave_inputs = [
        "replicate",
        "wave",
        "aheads",
        "parent-run-id",
        *PINNED_PARAMETERS,
        "control",
        "treatment",
        "gate-config",
    ]
    following = "{{=asInt(inputs.parameters.replicate) + 1}}"  # the look's number, and the next wave's replicate
    with DAG(name="wave", fail_fast=False, inputs=[Parameter(name=n) for n in wave_inputs]) as wave:
        for name, items, replicate in (
            ("train", "{{inputs.parameters.wave}}", "{{inputs.parameters.replicate}}"),
            ("ahead", AHEAD_ITEMS, following),
        ):
            Task(
                name=name,
                template=train,
                with_param=items,
                arguments={
                    "arm": "{{item.arm}}",
                    "fold": "{{item.fold}}",
                    "replicate": replicate,
                    "parent-run-id": "{{inputs.parameters.parent-run-id}}",
                    **{name: "{{inputs.parameters.%s}}" % name for name in PINNED_PARAMETERS},
                },
                # an ahead training that fails is trained again by its own wave
                continue_on=ContinueOn(failed=True, error=True) if name == "ahead" else None,
            )
        gate = Task(
            name="look",
            template=look,
            depends="train.Succeeded || train.Failed || train.Errored",
            arguments={
                "look": following,
                **{n: "{{inputs.parameters.%s}}" % n for n in ("control", "treatment", "gate-config")},
            },
        )
        Task(
            name="next",
            template=wave,
            depends="look.Succeeded && (ahead.Succeeded || ahead.Failed || ahead.Errored || ahead.Skipped)",
            when=f"{gate.get_parameter('decision')} == continue && "
            "{{inputs.parameters.replicate}} + 1 < {{workflow.parameters.max-replicates}}",
            arguments={
                "replicate": following,
                **{n: "{{inputs.parameters.%s}}" % n for n in wave_inputs if n != "replicate"},
            },
        )
    return wave


def build_workflow(smoke: bool = False) -> Workflow:
    """The study (six L40S pods, production scale) or, with `smoke`, the same graph on CPU pods
    at the `ci` scale for trying a cluster end to end in minutes."""
    if smoke:
        # the ci experiment trains with one torch thread; two cores hold a calibrate pod's two lanes
        train_resources = Resources(cpu_request=2, cpu_limit=2, memory_request="4Gi", memory_limit="8Gi")
        gpu_placement: dict = {}
        device = "cpu"
    else:
        # A training's host threads: the step's Python thread and the prefetch thread (gather into pinned
        # memory and copy, GIL released) at about one core each, MLflow's logging threads, torch's
        # intra-op pool for the few host ops and, in the first steps, Inductor's compile workers (all
        # sized by THREAD_ENV); the limit leaves two cores above the request for the compile burst.
        train_resources = Resources(cpu_request=6, cpu_limit=8, memory_request="40Gi", memory_limit="56Gi", gpus=1)
        gpu_placement = dict(
            node_selector={"nvidia.com/gpu.product": GPU_PRODUCT},
            tolerations=[Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        )
        device = "cuda"

    with Workflow(
        generate_name="ab-sweep-smoke-" if smoke else "ab-sweep-",
        namespace=NAMESPACE,
        service_account_name=SERVICE_ACCOUNT,
        entrypoint="ab-sweep",
        arguments=_params(smoke),
        labels={"app.kubernetes.io/part-of": "perception", "perception/workflow": "ab-sweep"},
        workflow_metadata=WorkflowMetadata(labels_from={SWEEP_ID_LABEL: LabelValueFrom(expression=SWEEP_ID_EXPR)}),
        active_deadline_seconds=3600 if smoke else 3 * 24 * 3600,
        # Failed pods stay for `kubectl logs`; the TTL removes the workflow and them later.
        pod_gc=PodGC(strategy="OnPodSuccess"),
        ttl_strategy=TTLStrategy(seconds_after_success=24 * 3600, seconds_after_failure=7 * 24 * 3600),
        # The image's user (uid 1000) must be able to write the PVCs. The pod-level seccomp profile also
        # covers Argo's init and wait containers (their other settings: infra/k8s/argo).
        security_context=PodSecurityContext(
            run_as_non_root=True,
            run_as_user=1000,
            run_as_group=1000,
            fs_group=1000,
            seccomp_profile=SeccompProfile(type="RuntimeDefault"),
        ),
    ) as w:
        p = "{{workflow.parameters.%s}}"
        prepare = _container(
            "prepare",
            "perception-sweep",
            [
                "prepare",
                "--sweep-id",
                SWEEP_ID,
                "--outputs",
                OUTPUTS,
                "--arms",
                p % "arms",
                "--design",
                p % "design",
                REPLICATES_FLAG,
                "--aa",
                p % "aa",
                "--control",
                p % "control",
                "--treatment",
                p % "treatment",
                "--gate-config",
                p % "gate-config",
                "--gpus",
                p % "gpus",
                *shared_overrides(),
            ],
            # `perception-data build` streams the files (benchmarks/results/data_pipeline_files.json):
            # ~0.17 GB (its reader threads share one 96 MB chunk budget) and ~30 B a snapshot (a year of
            # 1 s snapshots: ~1 GB), beside this step's own ~0.4 GB; ~0.27 CPU-s per million records. The
            # CPU limit sets the cgroup quota that data.workers follows (4 reader threads).
            Resources(
                cpu_request=4 if not smoke else 2,
                cpu_limit=4 if not smoke else 2,
                memory_request="3Gi" if not smoke else "2Gi",
                memory_limit="6Gi",
            ),
            volumes=_volumes(),  # runs too: the sweep's lock (runs/<sweep-id>/sweep.lock) is shared there
            outputs=[
                Parameter(name=name, value_from=ValueFrom(path=f"{OUTPUTS}/{name}"))
                for name in (
                    "parent-run-id",
                    "runs",
                    "wave",
                    "aheads",
                    "control",
                    "treatment",
                    "gate-config",
                    *PINNED_PARAMETERS,
                )
            ],
        )
        train = _container(
            "train",
            "perception-train",
            [
                f"sweep_id={SWEEP_ID}",
                "arm={{inputs.parameters.arm}}",
                "data.fold={{inputs.parameters.fold}}",
                "replicate={{inputs.parameters.replicate}}",
                "tracking.parent_run_id={{inputs.parameters.parent-run-id}}",
                f"trainer.device={device}",
                "trainer.progress=false",
                *shared_overrides(),
                *("%s={{inputs.parameters.%s}}" % (key, name) for key, name in PINNED.items()),  # the sweep's
            ],
            train_resources,
            retries=10,
            inputs=[
                Parameter(name="arm"),
                Parameter(name="fold"),
                Parameter(name="replicate"),
                Parameter(name="parent-run-id"),
                *(Parameter(name=name) for name in PINNED_PARAMETERS),
            ],
            volumes=_volumes(),
            **gpu_placement,
        )
        # one A/A sweep (its six trainings, one after another on the pod's device), no file yet; a re-run
        # after a preemption resumes it from the runs PVC
        calibrate_sweep = _container(
            "calibrate-sweep",
            "perception-sweep",
            [
                "calibrate",
                "--experiment",
                p % "experiment",
                "--sweeps",
                "1",
                "--arms",
                "{{inputs.parameters.arm}}",
                "--seed-base",
                "{{inputs.parameters.seed}}",
                "--no-write",
                "--cpu-workers",
                "2" if smoke else "1",
                f"trainer.device={device}",
                "trainer.progress=false",
                *_scale_overrides(),
            ],
            train_resources,
            retries=10,
            inputs=[Parameter(name="arm"), Parameter(name="seed")],
            volumes=_volumes(),
            **gpu_placement,
        )
        # every A/A sweep finished: each is decided again and the file written (nothing is trained here)
        calibrate_write = _container(
            "calibrate-write",
            "perception-sweep",
            [
                "calibrate",
                "--experiment",
                p % "experiment",
                "--sweeps",
                str(CALIBRATION_SWEEPS),
                "--seed-base",
                str(CALIBRATION_SEED_BASE),
                "trainer.progress=false",
                *_scale_overrides(),
            ],
            Resources(cpu_request=2, cpu_limit=2, memory_request="4Gi", memory_limit="8Gi"),
            volumes=_volumes(cache=False, data=False),
            env=NOISE_ENV,
        )
        gate = _gate(outputs=[Parameter(name="decision", value_from=ValueFrom(path=DECISION_FILE, default="none"))])
        # a sequential study's look k: the gate at look k from waves 0 … k-1 only, its decision (`continue`
        # or the final one) and its JSON line as outputs
        look = _gate(
            "look",
            ["--look", "{{inputs.parameters.look}}", "--json-file", GATE_LINE_FILE],
            inputs=[Parameter(name="look")],
            outputs=[
                Parameter(name="decision", value_from=ValueFrom(path=DECISION_FILE, default="none")),
                Parameter(name="summary", value_from=ValueFrom(path=GATE_LINE_FILE, default="{}")),
            ],
        )
        wave = _wave(train, look)

        # fail_fast off: one failed training must not stop the gate from being scheduled.
        with DAG(name="ab-sweep", fail_fast=False):
            calibrating = "{{workflow.parameters.calibrate}} == true"
            Task(
                name="calibrate",
                template=calibrate_sweep,
                when=calibrating,
                with_items=calibration_items(),
                arguments={"arm": "{{item.arm}}", "seed": "{{item.seed}}"},
            )
            # skipped along with calibrate; a failed A/A sweep leaves the file unwritten and the A/B
            # unstarted (a re-submission resumes it)
            Task(
                name="calibrate-write",
                template=calibrate_write,
                when=calibrating,
                depends="calibrate.Succeeded || calibrate.Skipped",
            )
            prep = Task(
                name="prepare", template=prepare, depends="calibrate-write.Succeeded || calibrate-write.Skipped"
            )
            fixed = "{{workflow.parameters.design}} == fixed"
            sequential = "{{workflow.parameters.design}} == sequential"
            trainings = Task(
                name="train",
                template=train,
                when=fixed,
                with_param=prep.get_parameter("runs").value,
                arguments={
                    "arm": "{{item.arm}}",
                    "fold": "{{item.fold}}",
                    "replicate": "{{item.replicate}}",
                    **{name: prep.get_parameter(name).value for name in ("parent-run-id", *PINNED_PARAMETERS)},
                },
            )
            # Every outcome counts, so the gate can refuse with a reason instead of never running.
            Task(
                name="gate",
                template=gate,
                when=fixed,
                arguments={
                    "control": prep.get_parameter("control").value,
                    "treatment": prep.get_parameter("treatment").value,
                    "gate-config": prep.get_parameter("gate-config").value,
                },
                depends="prepare && (train.Succeeded || train.Failed || train.Errored)",
            )
            prep >> trainings  # the gate's own depends names prepare and the trainings' every outcome
            # the sequential design: wave 0, which trains, looks and recurses into the next while the
            # gate says continue
            Task(
                name="waves",
                template=wave,
                when=sequential,
                depends="prepare",
                arguments={
                    "replicate": "0",
                    "wave": prep.get_parameter("wave").value,
                    "aheads": prep.get_parameter("aheads").value,
                    **{
                        name: prep.get_parameter(name).value
                        for name in ("parent-run-id", *PINNED_PARAMETERS, "control", "treatment", "gate-config")
                    },
                },
            )
    return w


# `hera generate yaml workflows/ab_sweep.py` renders every Workflow at module level: the study.
w = build_workflow()
