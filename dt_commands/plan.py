"""``dt-plan --stack dev``: what a stack declares, offline.

Evaluates the Pulumi program with mocks (no credentials, no network, no Pulumi CLI) and prints
the resources (type token, name, the properties that matter), the stack outputs and an estimated
monthly cost. A bad stack config prints its ConfigError and exits 2 before anything runs.
"""

from __future__ import annotations

import json
import runpy
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dt_commands.mocks import AzureMocks, DeclaredResource, RecordingMonitor, Registration
from infra import api_versions, cost, prices, toolchain
from infra.batch import NVME_ROOT
from infra.naming import PROJECT
from infra.settings.checks import ConfigError
from infra.settings.jobs import SHORTHAND_JOB
from infra.settings.stack import StackSettings
from infra.settings.values import REPO, load_schema
from infra.storage import SOFT_DELETE_DAYS
from trainer.common.cli import OneLineParser, int_in
from trainer.outputs.tracking import EXPERIMENT_VARIABLE, URI_VARIABLE

PROGRAM = REPO / "__main__.py"
SHOWN_PROPERTIES = (
    "location",
    "vmSize",
    "sku",
    "kind",
    "addressPrefix",
    "addressSpace",
    "privateIPAddress",
    "diskSizeGB",
    "shareQuota",
    "enabledProtocols",
    "adminUserEnabled",
    "anonymousPullEnabled",
    "allowSharedKeyAccess",
    "allowBlobPublicAccess",
    "minimumTlsVersion",
    "publicNetworkAccess",
    "interNodeCommunication",
    "targetNodeCommunicationMode",
    "taskSlotsPerNode",
    "metadata",  # the pool's: checkpointing, and acceptance on acceptance stacks
    "scaleSettings",
    "mountConfiguration",
    "allowedAuthenticationModes",
    "securityRules",
    "retentionInDays",
)


@dataclass
class Plan:
    settings: StackSettings
    resources: list[DeclaredResource]
    outputs: dict[str, Any]
    # Explicit depends_on per resource name (mocks see only data dependencies, in inputs).
    depends_on: dict[str, list[str]] = field(default_factory=dict)
    # Every dependency the engine would order creation by (explicit and through outputs).
    dependencies: dict[str, set[str]] = field(default_factory=dict)
    # The resource options each resource was declared with (ignore_changes, replace_on_changes).
    options: dict[str, Any] = field(default_factory=dict)
    # Every RegisterResource by the mocks' URN, components and the root stack included.
    registered: dict[str, Registration] = field(default_factory=dict)


def read_stack_file(path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a stack file; a file that is missing, unreadable, not UTF-8,
    not YAML or of another shape is a one-line ConfigError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ConfigError(
            f"stack file {path.name} not found: create it with `pulumi stack init`"
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"stack file {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start}); save it as UTF-8 (for example iconv -f latin1 -t utf-8), as the "
            "Pulumi CLI reads it"
        ) from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise ConfigError(
            f"stack file {path}: cannot read it ({getattr(err, 'strerror', None) or err})"
        ) from None
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"stack file {path.name}: not valid YAML{line}") from None
    except (ValueError, RecursionError) as err:  # a date such as 2026-02-30; nesting
        raise ConfigError(f"stack file {path.name}: not valid YAML ({err or 'too deep'})") from None
    values = loaded.get("config", {}) if isinstance(loaded, dict) else None
    if not isinstance(values, dict):
        raise ConfigError(f"stack file {path.name}: `config:` must be a mapping")
    return values


def _as_config_value(value: Any) -> str:
    # pulumi.Config reads strings; structured values travel as JSON, as with the CLI.
    return value if isinstance(value, str) else json.dumps(value)


def evaluate(stack: str, values: dict[str, Any], *, preview: bool = False) -> Plan:
    """Validate ``values``, then run the program under mocks and collect what it declares;
    ``preview`` evaluates it as `pulumi preview` does, with every computed output unknown."""
    import pulumi

    settings = StackSettings.from_mapping(stack, values, load_schema())
    mocks = AzureMocks(preview=preview)
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_all_config(
        {(k if ":" in k else f"{PROJECT}:{k}"): _as_config_value(v) for k, v in values.items()}
    )
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor)
    exported: dict[str, Any] = {}
    resolved: dict[str, Any] = {}
    real_export = pulumi.export

    protected: set[tuple[str, str]] = set()
    depends_on: dict[str, list[str]] = {}
    options: dict[str, Any] = {}
    evaluated: list[bool] = []  # set once this program has run

    def record_protection(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        # Mocks never see resource options; a stack transformation does. The runtime keeps it
        # registered for the process: a later evaluation's resources (of the same names) are
        # not this plan's.
        if evaluated:
            return None
        options[args.name] = args.opts
        if args.opts.protect:
            protected.add((args.type_, args.name))
        dependencies = args.opts.depends_on
        if isinstance(dependencies, list) and dependencies:
            depends_on[args.name] = [getattr(d, "_name", "?") for d in dependencies]
        return None

    @pulumi.runtime.test
    def run_program() -> pulumi.Output[Any]:
        pulumi.runtime.register_stack_transformation(record_protection)
        runpy.run_path(str(PROGRAM))
        return pulumi.Output.all(**exported).apply(resolved.update)

    pulumi.export = exported.__setitem__  # type: ignore[assignment]
    try:
        run_program()
    finally:
        pulumi.export = real_export
        evaluated.append(True)
    resources = [replace(r, protect=(r.typ, r.name) in protected) for r in mocks.resources]
    return Plan(
        settings, resources, resolved, depends_on, monitor.dependencies, options, monitor.registered
    )


def job_lines(plan: Plan, deployed: dict[str, str | None] | None = None) -> list[str]:
    """Each job and the run folder it trains in: the same training settings resume the same
    folder after a replace; other settings start a fresh run in another one. With
    ``deployed`` (job name -> its deployed run folder), each job says which it does."""
    from infra.job_spec import JobSpec, wall_clock_text

    specs = [
        JobSpec.from_props(r.inputs)
        for r in plan.resources
        if r.typ == "pulumi-python:dynamic:Resource" and "trainer_args" in r.inputs
    ]
    if not specs and not deployed:
        return []
    lines = ["Jobs (a replaced job resumes from its run folder while its training settings stay):"]
    for spec in specs:
        name = spec.name or SHORTHAND_JOB
        line = (
            f"  {name}: {spec.node_count} x {spec.vm_size}, job {spec.job_id}, "
            f"run folder {spec.checkpoint_path}"
        )
        if deployed is not None:
            before = deployed.get(name, "")
            if name not in deployed:
                line += "; a new job"
            elif before == spec.checkpoint_path:
                line += "; continues the deployed run"
            else:
                line += f"; STARTS A FRESH RUN (the deployed job trains in {before})"
        lines += [line, f"    runs: {runs_line(spec)}"]
        if spec.code_sha256:
            lines.append(f"    code: snapshot sha256 {spec.code_sha256}")
        if spec.tracking:
            lines.append(f"    tracking: {tracking_text(spec.tracking)}")
        lines.append(f"    limit: {wall_clock_text(spec.max_wall_clock_hours)}")  # infra.batch
    planned = {spec.name or SHORTHAND_JOB for spec in specs}
    for name, folder in sorted((deployed or {}).items()):
        if name not in planned:
            lines.append(f"  {name}: deleted by this change (its checkpoints stay in {folder})")
    return [*lines, ""]


def azureml_job_lines(plan: Plan) -> list[str]:
    """Each AzureML job (backend: azureml): its nodes, its name, where its run's checkpoints are
    in Blob (the same training settings resume them), what it runs, and a sweep's budget."""
    from dt_commands.preview_jobs import AZUREML_JOB_TYPE, azureml_name, azureml_run, azureml_runs

    jobs = [r for r in plan.resources if r.typ == AZUREML_JOB_TYPE]
    if not jobs:
        return []
    lines = ["AzureML jobs (a replaced job resumes from its checkpoints in Blob while its training "
             "settings stay):"]  # fmt: skip
    for job in jobs:
        state = {"inputs": job.inputs}
        props = job.inputs["properties"]
        nodes = (props.get("trial") or props).get("resources", {}).get("instanceCount")
        name = azureml_name(state, job.name)
        sweep = props.get("jobType") == "Sweep"
        where = "each trial trains afresh" if sweep else f"run in Blob {azureml_run(state)}"
        lines.append(f"  {name}: {nodes:g} node(s), job {job.inputs.get('id')}, {where}")
        lines.append(f"    runs: {azureml_runs(state)}")
        if sweep:
            limits = props.get("limits") or {}
            objective = props.get("objective") or {}
            lines.append(
                f"    sweep: {limits.get('maxTotalTrials', 0):g} trials, "
                f"{limits.get('maxConcurrentTrials', 0):g} at once, "
                f"{str(objective.get('goal', '')).lower()} {objective.get('primaryMetric')}"
            )
        timeout = (props.get("limits") or {}).get("timeout")
        lines.append(f"    limit: {'AzureML cancels it after ' + timeout if timeout else 'none'}")
    return [*lines, ""]


def tracking_text(tracking: Any) -> str:
    """Where a job's rank 0 tracks its run (the tracking section's variables, infra.batch)."""
    given = dict(tracking)
    return f"MLflow at {given[URI_VARIABLE]}, experiment {given[EXPERIMENT_VARIABLE]}"


def runs_line(spec: Any) -> str:
    """What a job's workers run: its own command and engine, or the trainer with its flags."""
    if spec.command:
        return f"{shlex.join(spec.command)} (engine {spec.engine}, its own command)"
    return shlex.join(["python", "-m", "trainer", *spec.trainer_args])


def deployed_run_folders(outputs_file: Path, stack: str) -> dict[str, str | None]:
    """Job name -> run folder, from a file of the deployed stack's `pulumi stack output --json`."""
    from dt_commands.stack_outputs import OutputsError, read_outputs, stack_jobs

    outputs = read_outputs(stack, outputs_file, label="--deployed")
    if "jobs" not in outputs and not outputs.get("job_id"):
        return {}  # a stack that submits no job
    try:
        jobs = stack_jobs(outputs, stack)
    except OutputsError as err:
        raise OutputsError(f"--deployed={outputs_file}: {err}") from None
    folders = {job.name: job.outputs.get("job_checkpoint_path") for job in jobs}
    for name, folder in folders.items():
        if folder is not None and not isinstance(folder, str):
            raise OutputsError(
                f"--deployed={outputs_file}: job {name}'s job_checkpoint_path={folder!r}: "
                "must be a string; give the output of `pulumi stack output --json`"
            )
    return folders


def azureml_quota_lines(s: StackSettings) -> list[str]:
    """The AzureML backend's core quota: AzureML's own per-region, per-VM-family quotas for its
    compute clusters, listed by Quotas_List (GET .../providers/Microsoft.MachineLearningServices/
    locations/{location}/quotas; REST reference, read 2026-11-29); low-priority nodes count
    against its low-priority quota."""
    c = s.cluster
    cores = f"{c.node_count} nodes x {c.gpu.vcpus} vCPUs = {c.node_count * c.gpu.vcpus}"
    kind = "low-priority (Spot) cores" if c.spot else f"dedicated cores of the {c.vm_size} family"
    url = (
        "https://management.azure.com/subscriptions/<subscription>/providers/"
        f"Microsoft.MachineLearningServices/locations/{s.location}/quotas?api-version=2024-04-01"
    )
    return [
        "AzureML compute quota needed (request it before `pulumi up`; AzureML's own quotas, "
        "not the Batch account's):",
        f"  {kind}: {cores}",
        f"  the quotas in {s.location}: az rest --method get --url '{url}'",
    ]


def quota_lines(s: StackSettings, account: str, resource_group: str) -> list[str]:
    """The Batch account's core quota the pool needs. A Batch account in BatchService mode has
    its own per-VM-family quotas, separate from the subscription's and often 0 for new accounts
    (articles/batch/batch-quota-limit.md): a pool beyond them never gets its nodes. Spot nodes
    count against the account's one low-priority core quota, across families."""
    c = s.cluster
    cores = f"{c.node_count} nodes x {c.gpu.vcpus} vCPUs = {c.node_count * c.gpu.vcpus}"
    family = f"az vm list-skus -l {s.location} --size {c.vm_size} --query '[0].family' -o tsv"
    query = (
        "{spot: lowPriorityCoreQuota}" if c.spot else "{dedicated: dedicatedCoreQuotaPerVmFamily}"
    )
    account = f"az batch account show -n {account} -g {resource_group} --query '{query}'"
    head = "Batch account quota needed (request it before `pulumi up`; new accounts often have 0):"
    if c.spot:
        return [
            head,
            f"  Spot (low-priority) cores, any family: {cores}",
            f"  the account's quota: {account}",
        ]
    return [
        head,
        f"  dedicated cores of the {c.vm_size} family: {cores}",
        f"  family name: {family}",
        f"  the account's quota: {account}",
    ]


def disk_lines(s: StackSettings) -> list[str]:
    """The node's OS disk against what it must hold: the HPC image and the trainer image, which
    Docker unpacks onto it (its compressed layers beside it while pulling); and where the
    nodes stage datasets and keep job code (infra.batch: the NVMe array, or the temp disk).
    AzureML's compute clusters have no OS disk setting: their disks are AzureML's."""
    if s.azureml.on_azureml:
        return [
            f"Node OS disk: AzureML's own (osDiskSizeGb={s.cluster.os_disk_size_gb} sizes a "
            "Batch pool's nodes only; an AzureML compute cluster has no such setting)"
        ]
    image = s.cluster.gpu.image
    trainer = toolchain.image_unpacked_gb()
    pulling = trainer * (1 + toolchain.PULL_OVERHEAD)
    peak = image.os_used_gb + pulling
    parts = "; ".join(f"{label} {size:g}" for label, size in toolchain.IMAGE_PARTS_GB)
    verdict = (
        f"fits, {s.cluster.os_disk_size_gb - peak:.0f} GB to spare at the pull's peak"
        if peak <= s.cluster.os_disk_size_gb
        else "TOO SMALL: raise osDiskSizeGb"
    )
    return [
        f"Node OS disk (osDiskSizeGb): {s.cluster.os_disk_size_gb} GB; {verdict}",
        f"  the HPC image uses about {image.os_used_gb} GB of its own {image.os_disk_gb} GB",
        f"  the trainer image is about {trainer:g} GB unpacked (GB: {parts}), about "
        f"{pulling:.1f} GB while it is pulled",
        *_staging_lines(s.cluster.gpu),
    ]


def _staging_lines(size: Any) -> list[str]:
    """Where a node of ``size`` (an infra.sizes.GpuSize) stages datasets, and how much room."""
    if size.nvme_disks:
        return [
            f"Datasets and job code: staged on the local NVMe array at {NVME_ROOT} "
            f"({size.nvme_disks} disks, {size.nvme_gib} GiB), which the start task assembles; "
            "kept for the node's later jobs, lost when the node is preempted, redeployed or "
            "removed"
        ]
    return [
        f"Datasets and job code: staged on the temporary disk ({size.name} has no local NVMe "
        "array); a dataset in the job preparation's folder, removed with the job"
    ]


def version_lines(s: StackSettings) -> list[str]:
    """What the data account's lifecycle policy (infra.storage) means for the bill: how long an
    overwritten or deleted blob is still stored, soft delete included."""
    longest = s.checkpoint_version_days + 1 + SOFT_DELETE_DAYS  # +1: the policy's daily run
    return [
        "Blob versions (blobVersionDays, checkpointVersionDays): a blob overwritten or deleted "
        f"stays billed as a previous version {_days(s.blob_version_days)} (checkpoints "
        f"{_days(s.checkpoint_version_days)})",
        f"  then {SOFT_DELETE_DAYS} days soft-deleted: a checkpoint the mirror prunes is billed "
        f"up to {longest} days longer (the policy runs once a day)",
        "  checkpoint storage at steady state: the kept checkpoints, plus those the mirror "
        f"pruned in the last {longest} days",
    ]


def api_lines(plan: Plan) -> list[str]:
    """The resources sent at an Azure API version announced for retirement (infra.api_versions)."""
    retiring = api_versions.retiring({r.typ for r in plan.resources})
    if not retiring:
        return ["Azure API versions: none of this stack's is announced for retirement"]
    return ["Azure API versions announced for retirement:", *(f"  {line}" for line in retiring)]


def _days(days: int) -> str:
    return "1 day" if days == 1 else f"{days} days"


def render(plan: Plan, busy_hours: int, deployed: dict[str, str | None] | None = None) -> str:
    s = plan.settings
    lines = [
        f"Offline plan of stack '{s.stack}' ({len(plan.resources)} resources; evaluated with "
        "Pulumi mocks: no Azure calls, computed values are placeholders)",
        "",
    ]
    for resource in plan.resources:
        shown = {k: resource.inputs[k] for k in SHOWN_PROPERTIES if k in resource.inputs}
        marker = "  (protected)" if resource.protect else ""
        lines.append(f"+ {resource.typ}  {resource.name}{marker}")
        if shown:
            lines.append(f"    {json.dumps(shown, sort_keys=True)}")
    account = str(plan.outputs.get("batch_account_endpoint", "<account>")).split(".")[0]
    resource_group = str(plan.outputs.get("resource_group_name", "<resource group>"))
    lines += [
        "",
        *(
            azureml_quota_lines(s)
            if s.azureml.on_azureml
            else quota_lines(s, account, resource_group)
        ),
        "",
        *disk_lines(s),
        "",
        *version_lines(s),
        "",
        *api_lines(plan),
        "",
        *job_lines(plan, deployed),
        *azureml_job_lines(plan),
        "Outputs:",
    ]
    lines += [f"  {key}: {json.dumps(value)}" for key, value in sorted(plan.outputs.items())]
    mode = (
        "always on"
        if s.cluster.scale_mode == "fixed"
        else f"autoscale: GPUs priced for {busy_hours} busy h/month (--busy-hours)"
    )
    lines += [
        "",
        f"Estimated monthly cost (OFFLINE ESTIMATE: list prices, {prices.PRICES_AS_OF}, "
        f"East US, pay-as-you-go; {mode}; storage usage and logs not included):",
    ]
    items = cost.monthly_cost(s.cost_inputs(), busy_hours)
    lines += [f"  {label:<55} ${cost:>12,.2f}" for label, cost in items]
    lines.append(f"  {'total':<55} ${cost.total(items):>12,.2f}")
    if s.budget.amount:
        lines.append(f"  {'budget (gpu-cluster:budget)':<55} ${s.budget.amount:>12,.2f}")
    return "\n".join(lines)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="dt-plan", description=__doc__)
    parser.add_argument("--stack", required=True, help="stack name (reads Pulumi.<stack>.yaml)")
    parser.add_argument("--stack-file", type=Path, help="another stack file to read")
    parser.add_argument(
        "--busy-hours",
        type=int_in(0, prices.HOURS_PER_MONTH),
        default=160,
        help="GPU hours per month assumed for autoscaled pools (default 160)",
    )
    parser.add_argument(
        "--deployed",
        type=Path,
        metavar="OUTPUTS_JSON",
        help="the deployed stack's `pulumi stack output --json` in a file: say per job whether "
        "this config continues its run or starts a fresh one",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dt_commands.stack_outputs import JobsError

    try:
        values = read_stack_file(args.stack_file or REPO / f"Pulumi.{args.stack}.yaml")
        plan = evaluate(args.stack, values)
        deployed = None
        if args.deployed is not None:
            deployed = deployed_run_folders(args.deployed, args.stack)
    except (ConfigError, JobsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return getattr(err, "code", 2)
    print(render(plan, args.busy_hours, deployed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
