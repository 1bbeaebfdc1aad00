"""``python -m dt_commands.acceptance --profile cpu|gpu``: prove the stack on a real subscription.

``make azure-check``. With the Pulumi CLI logged in to a state backend and ``az login`` done, it
creates a throwaway stack (``acceptance-<profile>-<UTC time>``) from a small profile, runs
``pulumi up`` through Pulumi's Automation API with the policy pack, waits for the training job
the stack submits (the same ``TrainingJob``), checks what it did, checks that ``pulumi destroy``
terminates a running job, then destroys the stack and removes it, printing the time taken and
an estimated cost. ``--dry-run`` prints the stack it would create (the offline plan of
``dt_commands.plan``) and the checks in order, with no Azure, CLI or network needed.

Profiles: ``cpu`` (2 x Standard_D2s_v5 with containers and inter-node communication, the NFS
server on a D2s_v5; no GPU and no InfiniBand, so those checks are skipped, visibly) and ``gpu``
(2 nodes of one InfiniBand GPU size, for subscriptions with that quota: NCCL over InfiniBand,
the preflight bandwidth recorded and held to the size's floor).

Every Azure and Pulumi call goes through an object passed in (the Automation API stack, a Batch
client from ``infra.batch.client``, a blob container client), so tests drive the whole
sequence with fakes. Exit codes: 0 every check passed; 1 a check or a Pulumi operation failed,
or a prerequisite is missing (before anything is created); 2 bad input (one line, before
anything is created).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from infra import cost, prices
from infra.config import PROJECT, REPO, ConfigError, StackSettings, acr_image, load_schema
from infra.image import BUILD_AGENT_CPUS
from infra.image_inputs import git_https_url
from infra.naming import global_name, prefix
from infra.sizes import CPU_ACCEPTANCE, SUPPORTED, size_of
from trainer.cli import OneLineParser
from trainer.config import one_line

POLICY_PACK = REPO / "policy"
JOB_TYPE = "pulumi-python:dynamic:Resource"  # TrainingJob's type token (infra/job.py)
POLL_SECONDS = 30.0
# What the dry run assumes the ACR Task build takes (not a measurement; Horovod's NCCL build
# dominates it); a real run counts its `pulumi up`, which holds the build, as an upper bound.
ASSUMED_BUILD_MINUTES = 60
AUTH_WAIT_SECONDS = 600.0  # new role assignments and IP rules take minutes to apply
LOG_WAIT_SECONDS = 300.0  # output files are uploaded as the task completes
RUNNING_WAIT_SECONDS = 1800.0
# The log lines the checks read: trainer/run.py, trainer/launch/supervisor.py and its report.
_CHECKPOINT_LINE = re.compile(r"checkpoint written: (\S+) \(uid (\d+)\)")
_WORKERS_LINE = re.compile(r"node (\d+)/(\d+): starting (\d+) worker\(s\)")
_PREFLIGHT_LINE = re.compile(r"preflight: allreduce bus bandwidth ([0-9.]+) GB/s")
_NODE_SECTION = re.compile(r"^===== node (\d+)/(\d+) ", re.MULTILINE)


class InputError(ValueError):
    """Bad input: one line, exit 2, nothing created."""


class Unavailable(RuntimeError):
    """A prerequisite is missing on this machine: one line, exit 1, nothing created."""


class CheckFailed(RuntimeError):
    """A check did not hold; one line naming what was expected and what was seen."""


@dataclass(frozen=True)
class Profile:
    name: str
    vm_size: str  # the default; --vm-size picks another InfiniBand size for gpu
    node_count: int
    scale_mode: str
    trainer_config: str
    long_trainer_config: str  # the job `pulumi destroy` must terminate while it runs
    job_minutes: int  # how long the first job may take, pool allocation and image pull included
    assumed_minutes: int  # the whole run, for the dry run's cost line (not a measurement)
    what: str
    target: tuple[int, float] | None = None  # (minutes, USD) the run should stay under
    # The whole run with --image-ref (no build): pool allocation and the image's pull dominate.
    reused_minutes: int = 30


PROFILES = {
    "cpu": Profile(
        "cpu",
        "Standard_D2s_v5",
        2,
        # The nodes cost little: start them at once instead of waiting for autoscale.
        "fixed",
        "trainer/presets/acceptance-cpu.yaml",
        "trainer/presets/acceptance-cpu-long.yaml",
        60,
        75,
        "2 x Standard_D2s_v5 (2 vCPUs, no GPU, no InfiniBand), containers, inter-node "
        "communication, one Gloo worker per node",
        (30, 2.0),
    ),
    "gpu": Profile(
        "gpu",
        # The least expensive InfiniBand size in infra/prices.py.
        "Standard_ND96asr_v4",
        2,
        # GPU nodes start when the job is queued, not while the image builds.
        "autoscale",
        "trainer/presets/acceptance-gpu.yaml",
        "trainer/presets/acceptance-gpu-long.yaml",
        90,
        90,
        "2 nodes of an InfiniBand GPU size, one worker per GPU, NCCL over InfiniBand",
        reused_minutes=45,
    ),
}


@dataclass(frozen=True)
class Check:
    key: str
    title: str
    what: str
    skipped: Mapping[str, str] = field(default_factory=dict)  # profile -> why


CHECKS = (
    Check(
        "quota",
        "Batch core quota",
        "a first `pulumi up --target` (policy pack on) creates only the Batch account and what "
        "it depends on; its dedicated cores, in total and for the size's family, must cover "
        "the pool (new accounts may start at 0): a shortfall fails here, before the image "
        "build, the NFS server and the pool",
    ),
    Check(
        "up",
        "pulumi up",
        "the full `pulumi up` with the policy pack (every guardrail mandatory): environment, "
        "image build, training job",
    ),
    Check(
        "outputs",
        "stack outputs",
        "job_id, job_state, job_log_url, job_checkpoint_path, job_portal_url, image_ref "
        "(pinned by digest), vm_size and node_count as configured",
    ),
    Check(
        "job",
        "job completes",
        "the Batch job (polled with the deployer's Entra credential) reaches completed",
    ),
    Check(
        "nodes",
        "exit 0 on every node",
        "the primary task and every subtask exited 0, on as many distinct nodes as the pool "
        "has; each node passed its start task first (waitForSuccess)",
    ),
    Check(
        "logs",
        "logs uploaded",
        "stdout.txt and stderr.txt of the task are in the `logs` container under the job id, "
        "read with the deployer's Entra credential from this machine's IP",
    ),
    Check(
        "workers",
        "every node trained",
        "the primary's report holds every node's launcher log, each node started one worker "
        "per GPU (one on a CPU node), and every node finished",
    ),
    Check(
        "checkpoint",
        "checkpoints on NFS",
        "the trainer wrote its checkpoints (every checkpoint_every steps and the last) under "
        "the run folder job_checkpoint_path, as the task's non-root user",
    ),
    Check(
        "gpu-checks",
        "GPU, driver, InfiniBand",
        "each node's start task checked its GPUs, driver and active InfiniBand ports (a node "
        "failing them never runs a task)",
        {
            "cpu": "no GPU and no InfiniBand on Standard_D2s_v5; each node's start task prints "
            "'node ok: CPU acceptance profile, GPU and InfiniBand checks skipped'"
        },
    ),
    Check(
        "preflight",
        "NCCL over InfiniBand",
        "the preflight allreduce bus bandwidth is recorded in the log and at or above the "
        "size's floor (70% of its InfiniBand baseline; TCP cannot reach it)",
        {"cpu": "no InfiniBand: Gloo over TCP and no bandwidth floor"},
    ),
    Check(
        "terminate",
        "destroy stops a running job",
        "the job is replaced by a long run (pulumi up with another trainerConfig); once its "
        "task runs, `pulumi destroy --target <the job>` terminates and deletes it",
    ),
    Check(
        "destroy",
        "destroy and remove",
        "`pulumi destroy` removes every resource (protectData false) and the stack is removed",
    ),
)


# ---------------------------------------------------------------- options and stack config
@dataclass(frozen=True)
class Options:
    profile: Profile
    stack_name: str
    location: str
    vm_size: str
    budget_email: str
    image_builder: str
    image_source_repo: str
    ssh_public_key: str
    client_ip: str | None  # this machine's public IP, admitted to storage (and the registry)
    keep_on_failure: bool = False
    secrets_provider: str | None = None
    image_source_token: str | None = None  # read from --image-source-token-env, never argv
    image_ref: str = ""  # --image-ref: run this image, build none
    image_registry_id: str = ""  # its registry's ARM id (az acr show), where AcrPull goes
    # Settings a dry run could not look up: key -> what a real run uses instead.
    placeholders: Mapping[str, str] = field(default_factory=dict)


def stack_name(profile: str, now: datetime | None = None) -> str:
    """``acceptance-<profile>-<UTC time>``: a new stack every run."""
    moment = now or datetime.now(UTC)
    return f"acceptance-{profile}-{moment.strftime('%Y%m%d-%H%M%S')}"


def throwaway_ssh_key() -> str:
    """An OpenSSH public key whose private half is never kept: the NFS VM needs a key and
    nobody logs in to an acceptance stack's server. ``cryptography`` comes with
    azure-identity (through msal)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key()
    text = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{text.decode()} acceptance-throwaway"


def stack_values(opts: Options) -> dict[str, Any]:
    """The profile's stack config (short camelCase keys), budget included."""
    profile = opts.profile
    values: dict[str, Any] = {
        "team": "acceptance",  # with a stack named acceptance-*: names are the stack name
        "costCenter": "acceptance",
        "location": opts.location,
        "vmSize": opts.vm_size,
        "nodeCount": profile.node_count,
        "scaleMode": profile.scale_mode,
        "idleMinutes": 10,
        "nfsMode": "vm",
        "nfsVmSize": "Standard_D2s_v5",
        "nfsDiskCount": 1,
        "nfsDiskSizeGb": 32,
        "sshPublicKey": opts.ssh_public_key,
        "storageAllowedIps": [opts.client_ip] if opts.client_ip else [],
        "registryAllowedIps": (
            [opts.client_ip] if opts.client_ip and opts.image_builder == "docker" else []
        ),
        "logRetentionDays": 30,
        "protectData": False,  # destroy removes everything
        "budgetEmails": [opts.budget_email],
        "imageBuilder": opts.image_builder,
        "imageSourceRepo": opts.image_source_repo,
        "submitJob": True,
        "trainerConfig": profile.trainer_config,
        "acceptanceProfile": profile.name,
    }
    if opts.image_ref:  # nothing to build: the build settings stay out of the stack
        del values["imageBuilder"], values["imageSourceRepo"]
        values.update(imageRef=opts.image_ref, imageRegistryId=opts.image_registry_id)
    values["budget"] = _budget_for(opts.stack_name, values)
    return values


def _budget_for(name: str, values: dict[str, Any]) -> int:
    """A monthly budget above the stack's own monthly estimate (the policy pack requires one
    that covers it), rounded up to USD 100."""
    settings = StackSettings.from_mapping(name, {**values, "budget": 0}, load_schema())
    monthly = cost.total(cost.monthly_cost(settings.cost_inputs()))
    return int(math.ceil(monthly * 1.25 / 100) * 100)


def validated(opts: Options, values: dict[str, Any]) -> StackSettings:
    try:
        return StackSettings.from_mapping(opts.stack_name, values, load_schema())
    except ConfigError as err:
        raise InputError(str(err)) from None


def config_map(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as Automation API config for ``set_all_config(..., path=True)``: one
    ``gpu-cluster:<key>`` per scalar, ``<key>[i]`` per list element (what
    ``pulumi config set --path`` stores as a list, which the schema's array type needs)."""
    from pulumi.automation import ConfigValue

    out: dict[str, Any] = {}
    for key, value in values.items():
        items = list(enumerate(value)) if isinstance(value, list | tuple) else [(None, value)]
        for index, item in items:
            name = f"{PROJECT}:{key}" + ("" if index is None else f"[{index}]")
            text = str(item).lower() if isinstance(item, bool) else str(item)
            out[name] = ConfigValue(value=text)
    return out


def expected_checkpoints(trainer_config: str) -> list[int]:
    """The steps the preset checkpoints at: every checkpoint_every, and the last step."""
    settings = yaml.safe_load((REPO / trainer_config).read_text(encoding="utf-8"))
    every, last = int(settings.get("checkpoint_every") or 0), int(settings["max_steps"])
    steps = list(range(every, last + 1, every)) if every else []
    return steps if last in steps else [*steps, last]


# ---------------------------------------------------------------- the staged up
BATCH_ACCOUNT_TYPE = "azure-native:batch:BatchAccount"
ROOT_STACK_TYPE = "pulumi:pulumi:Stack"


def account_targets(plan: Any, stack: str) -> list[str]:
    """The URNs a first, targeted `pulumi up` creates so that the Batch account's core quota
    can be read before the pool, the image build and the job exist: the account and, again
    and again, what each of them depends on and its parent. The engine refuses a targeted
    resource whose dependency is neither targeted nor already in the stack ("depends on ...
    which was not specified in --target list": pulumi/pulumi #5869, #3369), and a parent is
    such a dependency (#14531). The root stack and the default providers the engine creates
    itself (the targeted runs of #3369 and #14531 create both)."""
    nodes = plan.registered
    (account,) = [urn for urn, node in nodes.items() if node.typ == BATCH_ACCOUNT_TYPE]
    seen: set[str] = set()
    todo = [account]
    while todo:
        urn = todo.pop()
        if urn in nodes and urn not in seen and nodes[urn].typ != ROOT_STACK_TYPE:
            seen.add(urn)
            todo += [*nodes[urn].dependencies, nodes[urn].parent]
    return sorted(engine_urn(nodes, urn, stack) for urn in seen)


def engine_urn(nodes: Mapping[str, Any], urn: str, stack: str) -> str:
    """The URN the engine gives a resource: ``urn:pulumi:<stack>::<project>::<types>::<name>``
    where ``<types>`` is the chain of its ancestors' types and its own joined by ``$``, the
    root stack left out (pkg/resource/urn.go; the URNs quoted in pulumi/pulumi #5869 and
    #3369). Pulumi's mocks keep the parent's last type only and the root stack's type."""
    name, types = nodes[urn].name, []
    while urn in nodes and nodes[urn].typ != ROOT_STACK_TYPE:
        types.append(nodes[urn].typ)
        urn = nodes[urn].parent
    return f"urn:pulumi:{stack}::{PROJECT}::{'$'.join(reversed(types))}::{name}"


def _plan_targets(opts: Options, values: dict[str, Any]) -> list[str]:
    """The staged up's targets, from the program as the offline plan evaluates it."""
    from dt_commands.plan import evaluate

    return account_targets(evaluate(opts.stack_name, values), opts.stack_name)


# ---------------------------------------------------------------- cost
def run_cost(
    s: StackSettings, hours: float, node_hours: float, build_minutes: float = 0.0
) -> list[tuple[str, float]]:
    """(item, USD) for a stack that existed ``hours`` with ``node_hours`` of pool nodes and an
    ACR Task build of ``build_minutes`` (acr builder), at the list prices of infra/prices.py. A
    registry bills a fixed charge per started day; the build agent each CPU-second."""
    days = max(1, math.ceil(hours / 24))
    build, registry = [], []
    if not s.image.ref:  # an imageRef builds nothing and has no registry of the stack's
        registry = [
            (f"container registry (Premium), {days} day(s)", prices.ACR_PREMIUM_PER_DAY * days)
        ]
    if s.image.builder == "acr" and build_minutes > 0 and not s.image.ref:
        build = [
            (
                f"image build: ACR Task agent, {BUILD_AGENT_CPUS} CPUs x {build_minutes:.0f} min",
                BUILD_AGENT_CPUS * build_minutes * 60 * prices.ACR_TASK_PER_CPU_SECOND,
            )
        ]
    nfs_gb = s.nfs.disk_count * s.nfs.disk_size_gb
    network = prices.NAT_GATEWAY_PER_HOUR + prices.PUBLIC_IP_PER_HOUR
    return [
        (
            f"pool: {node_hours:.2f} node-hours of {s.cluster.vm_size}",
            prices.VM_PER_HOUR[s.cluster.vm_size] * node_hours,
        ),
        (f"NFS server {s.nfs.vm_size}, {hours:.2f} h", prices.VM_PER_HOUR[s.nfs.vm_size] * hours),
        (
            f"NFS premium disk {nfs_gb} GiB, {hours:.2f} h",
            nfs_gb * prices.PREMIUM_SSD_PER_GB_MONTH * hours / prices.HOURS_PER_MONTH,
        ),
        (f"NAT gateway + public IP, {hours:.2f} h", network * hours),
        *registry,
        *build,
    ]


def cost_lines(
    s: StackSettings, hours: float, node_hours: float, build_minutes: float = 0.0
) -> list[str]:
    items = run_cost(s, hours, node_hours, build_minutes)
    lines = [f"    {label:<56} ${usd:>8.2f}" for label, usd in items]
    lines.append(f"    {'total':<56} ${cost.total(items):>8.2f}")
    lines.append(
        f"    (list prices {prices.PRICES_AS_OF}, East US, pay-as-you-go; not included: storage "
        "transactions, log ingestion, bandwidth)"
    )
    return lines


# ---------------------------------------------------------------- the dry run
def describe(opts: Options, values: dict[str, Any], out: TextIO) -> None:
    """What a real run would create and check, in order (the offline plan under mocks)."""
    from dt_commands.plan import evaluate, render

    profile = opts.profile
    settings = validated(opts, values)
    plan = evaluate(opts.stack_name, values)
    w = out.write
    w(
        f"Acceptance check, profile {profile.name}: {profile.what}.\n"
        "DRY RUN: nothing is created; no Azure, Pulumi CLI or network was used.\n\n"
        f"It would create the stack {opts.stack_name} of project {PROJECT} (this directory) "
        "with the Automation API, set this config (pulumi config set --path):\n"
    )
    for key, value in values.items():
        note = opts.placeholders.get(key)
        w(f"  {PROJECT}:{key}: {json.dumps(value)}" + (f"  # {note}" if note else "") + "\n")
    if opts.client_ip is None:
        lists = "storageAllowedIps" + (
            " and registryAllowedIps" if opts.image_builder == "docker" else ""
        )
        w(
            f"  (a real run adds this machine's public IP to {lists}, looked up when it "
            "starts, or --client-ip)\n"
        )
    staged = account_targets(plan, opts.stack_name)
    w(
        f"and run `pulumi up --policy-pack {POLICY_PACK.relative_to(REPO)}` twice. First with "
        f"--target for the Batch account and the {len(staged) - 1} resources it needs, so its "
        "core quota is read before the image build, the NFS server and the pool exist:\n"
    )
    for urn in staged:
        w(f"  {urn.split('::')[2].rsplit('$', 1)[-1]}  {urn.rsplit('::', 1)[1]}\n")
    w(
        "then without, which declares:\n\n"
        f"{render(plan, 160)}\n\n"
        "Checks, in order:\n"
        f"   0. {'prerequisites':<28} the Pulumi CLI on PATH and logged in to a state backend "
        "(and a secrets provider or passphrase for it); `az account show` succeeds\n"
    )
    for number, check in enumerate(CHECKS, start=1):
        reason = check.skipped.get(profile.name)
        status = f"SKIPPED for profile {profile.name}: {reason}" if reason else check.what
        w(f"  {number:>2}. {check.title:<28} {status}\n")
    steps = ", ".join(str(step) for step in expected_checkpoints(profile.trainer_config))
    w(
        f"\nThe job: {profile.trainer_config} on {profile.node_count} x {opts.vm_size} "
        f"(checkpoints at steps {steps}); the run `pulumi destroy` must stop: "
        f"{profile.long_trainer_config}.\n"
        f"Then: the time taken and an estimated cost{_target_text(profile)}. If the run takes "
        + (
            f"{profile.reused_minutes} min (an assumption, not a measurement; no build):\n"
            if opts.image_ref
            else f"{profile.assumed_minutes} min (an assumption, not a measurement; the image "
            "build on ACR is most of it):\n"
        )
    )
    minutes = profile.reused_minutes if settings.image.ref else profile.assumed_minutes
    hours = minutes / 60
    node_hours = _node_hours(settings, hours, hours)
    w("\n".join(cost_lines(settings, hours, node_hours, ASSUMED_BUILD_MINUTES)) + "\n")
    if settings.image.ref:
        w(
            f"    (--image-ref: no build and no registry of the stack's; the run assumed at "
            f"{minutes} min; {settings.image.ref.split('@')[0]}'s registry bills its owner)\n"
        )
    elif settings.image.builder == "acr":
        w(
            f"    (the image build assumed at {ASSUMED_BUILD_MINUTES} min of the ACR Task agent, "
            "its usual length with the Horovod build; a real run counts the whole `pulumi up` "
            "as build time, an upper bound)\n"
        )
    if settings.cluster.scale_mode != "fixed":
        w("    (autoscaled pool: counted for the whole run, an upper bound)\n")


def _target_text(profile: Profile) -> str:
    if profile.target is None:
        return ""
    minutes, usd = profile.target
    return f" (target: under {minutes} min and under ${usd:.0f})"


def _node_hours(s: StackSettings, stack_hours: float, busy_hours: float) -> float:
    """Fixed pools run for the stack's whole life; autoscaled ones roughly while jobs are
    queued or running, plus the idle time before they scale to zero."""
    if s.cluster.scale_mode == "fixed":
        return s.cluster.node_count * stack_hours
    return s.cluster.node_count * min(stack_hours, busy_hours + s.cluster.idle_minutes / 60)


# ---------------------------------------------------------------- the real run
@dataclass
class Result:
    check: Check
    status: str  # PASS, FAIL, SKIPPED, NOT RUN
    detail: str = ""


def _one_line(err: BaseException) -> str:
    """The line of a (multi-line) error that says what went wrong. An Automation API
    ``CommandError`` is the CLI's whole result (`` code: ...``, `` stdout: ...``,
    `` stderr: ...``); the labels go."""
    lines = [
        re.sub(r"^(code|stdout|stderr):\s*", "", line.strip())
        for line in str(err).splitlines()
        if line.strip()
    ]
    for line in reversed(lines):
        if "error" in line.lower():
            return one_line(line)
    return one_line(lines[-1] if lines else type(err).__name__)


def pool_lines(client: Any, job: Any, cancel_hint: str) -> list[str]:
    from dt_commands.jobs.status import pool_lines as lines

    return lines(client, job, cancel_hint)


def _state(value: Any) -> str:
    from infra.batch import state_text

    return state_text(value)


class Acceptance:
    """One run against one Automation API stack. ``batch_client(endpoint)`` and
    ``logs_container(account_url)`` make the data-plane clients (the real ones by default)."""

    def __init__(
        self,
        opts: Options,
        values: dict[str, Any],
        stack: Any,
        *,
        batch_client: Callable[[str], Any],
        logs_container: Callable[[str], Any],
        out: TextIO,
        run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        targets: list[str] | None = None,
    ) -> None:
        self.opts, self.values, self.stack = opts, values, stack
        self.targets = targets or []  # the Batch account and what it needs (account_targets)
        self.shell = run or _run
        self.settings = validated(opts, values)
        self.batch_client, self.logs_container = batch_client, logs_container
        self.out, self.clock, self.sleep = out, clock, sleep
        self.outputs: dict[str, Any] = {}
        self.client: Any = None
        self.stdout_text = ""
        self.busy_since: float | None = None
        self.build_minutes = 0.0  # `pulumi up`'s minutes: the ACR build's upper bound

    # ---------------------------------------------------------- driver
    def run(self) -> int:
        started = self.clock()
        results: list[Result] = []
        failed = False
        steps = [check for check in CHECKS if check.key != "destroy"]
        try:
            for check in steps:
                reason = check.skipped.get(self.opts.profile.name)
                if reason:
                    results.append(Result(check, "SKIPPED", reason))
                    self.say(f"{check.title}: SKIPPED ({reason})")
                    continue
                self.say(f"{check.title}: {check.what}")
                try:
                    detail = getattr(self, "_" + check.key.replace("-", "_"))()
                except CheckFailed as err:
                    results.append(Result(check, "FAIL", str(err)))
                    failed = True
                    break
                except Exception as err:  # a Pulumi or Azure error: one line, then clean up
                    results.append(Result(check, "FAIL", f"{type(err).__name__}: {_one_line(err)}"))
                    failed = True
                    break
                results.append(Result(check, "PASS", detail))
                self.say(f"{check.title}: PASS ({detail})")
        except KeyboardInterrupt:
            failed = True
            self.say("interrupted: cleaning up")
        finally:
            done = {r.check.key for r in results}
            results += [Result(c, "NOT RUN") for c in steps if c.key not in done]
            results.append(self._teardown(failed))
        hours = (self.clock() - started) / 3600
        busy = (self.clock() - self.busy_since) / 3600 if self.busy_since is not None else 0.0
        self._summary(results, hours, _node_hours(self.settings, hours, busy))
        return 1 if any(r.status == "FAIL" for r in results) else 0

    def say(self, message: str) -> None:
        self.out.write(f"acceptance: {message}\n")
        self.out.flush()

    def _pulumi_line(self, line: str) -> None:
        self.out.write(f"  | {line}\n")
        self.out.flush()

    # ---------------------------------------------------------- steps (in CHECKS order)
    def _configure(self) -> None:
        self.stack.set_all_config(config_map(self.values), path=True)
        if self.opts.image_source_token:
            from pulumi.automation import ConfigValue

            self.stack.set_config(
                f"{PROJECT}:imageSourceToken",
                ConfigValue(value=self.opts.image_source_token, secret=True),
            )

    def _up(self) -> str:
        started = self.clock()
        result = self.stack.up(
            on_output=self._pulumi_line,
            on_error=self._pulumi_line,
            policy_packs=[str(POLICY_PACK)],
        )
        self.busy_since = self.clock()
        self.build_minutes = (self.busy_since - started) / 60
        changes = getattr(getattr(result, "summary", None), "resource_changes", None) or {}
        return f"{changes.get('create', 0)} resources created"

    def _outputs(self) -> str:
        self.outputs = {key: out.value for key, out in self.stack.outputs().items()}
        o, s = self.outputs, self.settings
        required = (
            "job_id",
            "job_state",
            "job_log_url",
            "job_checkpoint_path",
            "job_portal_url",
            "image_ref",
            "batch_account_endpoint",
            "resource_group_name",
            "storage_account_name",
            "vm_size",
            "node_count",
        )
        missing = [key for key in required if o.get(key) in (None, "")]
        if missing:
            raise CheckFailed(f"stack outputs lack {', '.join(missing)}")
        expectations = (
            (
                o["vm_size"] == s.cluster.vm_size,
                f"vm_size={o['vm_size']}, configured {s.cluster.vm_size}",
            ),
            (
                int(o["node_count"]) == s.cluster.node_count,
                f"node_count={o['node_count']}, configured {s.cluster.node_count}",
            ),
            ("@sha256:" in o["image_ref"], f"image_ref={o['image_ref']} is not pinned by digest"),
            (
                o["image_ref"] == (self.opts.image_ref or o["image_ref"]),
                f"image_ref={o['image_ref']}, not --image-ref {self.opts.image_ref}",
            ),
            (
                o["job_log_url"].endswith(f"/logs/{o['job_id']}/")
                and urllib.parse.urlsplit(o["job_log_url"]).hostname
                == f"{o['storage_account_name']}.blob.core.windows.net",
                f"job_log_url={o['job_log_url']} is not the job's folder in the logs container",
            ),
            (
                o["job_checkpoint_path"].startswith(f"shared/runs/{self.opts.stack_name}/"),
                f"job_checkpoint_path={o['job_checkpoint_path']} is not under this stack's runs",
            ),
            (
                o["job_state"] in ("active", "completed", "terminating"),
                f"job_state={o['job_state']}",
            ),
        )
        for ok, problem in expectations:
            if not ok:
                raise CheckFailed(problem)
        self.client = self.batch_client(o["batch_account_endpoint"])
        return f"job {o['job_id']} ({o['job_state']}), image {o['image_ref'].split('@')[1][:19]}"

    def _quota(self) -> str:
        """A Batch account in Batch-service mode has its own core quotas, per VM family and in
        total, set when the account is created; for new accounts they may be reduced, in some
        regions to zero, and a pool beyond them never gets its nodes (articles/batch/
        batch-quota-limit.md). No subscription quota tells them before the account exists
        (the Compute vCPU quotas count only for UserSubscription accounts, same article), so a
        targeted `pulumi up` creates the account first; read them with the ARM rights that
        created it."""
        self._configure()
        if not self.targets:
            raise CheckFailed("no targets for the Batch account's staged `pulumi up`")
        self.say(f"pulumi up --target: the Batch account and {len(self.targets) - 1} resources")
        self.stack.up(
            target=self.targets,
            on_output=self._pulumi_line,
            on_error=self._pulumi_line,
            policy_packs=[str(POLICY_PACK)],
        )
        s = self.settings
        # The names infra/stack.py gives them (naming is deterministic per stack).
        account = global_name(team=s.team, stack=s.stack, role="batch")
        group = f"rg-{prefix(team=s.team, stack=s.stack)}"
        need = s.cluster.node_count * s.cluster.gpu.vcpus
        family_query = f"[?name=='{s.cluster.vm_size}'].family | [0]"
        quotas = (
            "{total: dedicatedCoreQuota, families: dedicatedCoreQuotaPerVmFamily, "
            "enforced: dedicatedCoreQuotaPerVmFamilyEnforced}"
        )
        skus = self.shell(
            [
                *("az", "vm", "list-skus", "-l", s.location, "--size", s.cluster.vm_size),
                *("--query", family_query, "-o", "tsv"),
            ]
        )
        shown = self.shell(
            [
                *("az", "batch", "account", "show", "-n", account, "-g", group),
                *("--query", quotas, "-o", "json"),
            ]
        )
        family = skus.stdout.strip()
        try:
            quota = json.loads(shown.stdout)
            total = int(quota["total"])
            families = {f["name"]: int(f["coreQuota"]) for f in quota.get("families") or []}
        except (ValueError, KeyError, TypeError):
            return f"not read (az batch account show: {one_line(shown.stderr.strip()[:200])})"
        # Per-family quotas count only where the account enforces them (the ARM property
        # dedicatedCoreQuotaPerVmFamilyEnforced); then a family it does not list has none.
        have = families.get(family, 0) if quota.get("enforced") and family else total
        if min(have, total) < need:
            raise CheckFailed(
                f"Batch account {account} has {have} dedicated cores of "
                f"{family or s.cluster.vm_size} "
                f"({total} in total); the pool needs {need}: request more for this region "
                "(az batch account show shows the quotas; portal: Batch account > Quotas)"
            )
        return f"{need} cores needed; {family or s.cluster.vm_size}: {have}, total: {total}"

    def _job(self) -> str:
        job_id = self.outputs["job_id"]
        started = self.clock()
        deadline = started + self.opts.profile.job_minutes * 60
        seen = ""
        while True:
            job = self.client.get_job(job_id)
            state = _state(job.state)
            task = self._task_state(job_id)
            if f"{state}/{task}" != seen:
                seen = f"{state}/{task}"
                self.say(f"job {job_id}: {state}, task {task}")
            if task == "active":
                # Nodes that will not come (quota, capacity, failed start tasks) show on the
                # pool only (infra/pool_health.py): stop now, not after the profile's limit.
                problems = pool_lines(self.client, job, "the acceptance check destroys the stack")
                if problems:
                    raise CheckFailed(problems[0])
            if state == "completed":
                minutes = (self.clock() - started) / 60
                return f"completed after {minutes:.0f} min"
            if self.clock() > deadline:
                raise CheckFailed(
                    f"job {job_id} is still {state} (task {task}) after "
                    f"{self.opts.profile.job_minutes} min: look at the job and the pool's "
                    f"nodes in the portal ({self.outputs['job_portal_url']})"
                )
            self.sleep(POLL_SECONDS)

    def _task_state(self, job_id: str) -> str:
        """The task's state; "not added yet" while the job has none."""
        from azure.core.exceptions import ResourceNotFoundError

        from infra.batch import TASK_ID

        try:
            return _state(self.client.get_task(job_id, TASK_ID).state)
        except ResourceNotFoundError:
            return "not added yet"

    def _nodes(self) -> str:
        from infra.batch import TASK_ID

        job_id = self.outputs["job_id"]
        task = self.client.get_task(job_id, TASK_ID)
        info = task.execution_info
        code = None if info is None else info.exit_code
        if code != 0:
            failure = getattr(getattr(info, "failure_info", None), "message", None)
            raise CheckFailed(
                f"primary task exit code {code}"
                + (f" ({failure})" if failure else "")
                + f": its stdout and stderr go to {self.outputs['job_log_url']}"
            )
        nodes = {getattr(task.node_info, "node_id", None)}
        # List Subtasks returns the subtasks only, not the primary (ID 0)
        # (articles/batch/batch-mpi.md, "Obtain information about subtasks").
        subtasks = list(self.client.list_subtasks(job_id, TASK_ID))
        for sub in subtasks:
            if _state(sub.state) != "completed" or sub.exit_code != 0:
                raise CheckFailed(
                    f"subtask {sub.id} on node {getattr(sub.node_info, 'node_id', '?')}: "
                    f"{_state(sub.state)}, exit code {sub.exit_code}"
                )
            nodes.add(getattr(sub.node_info, "node_id", None))
        nodes.discard(None)
        expected = self.settings.cluster.node_count
        if len(subtasks) != expected - 1 or len(nodes) != expected:
            raise CheckFailed(
                f"{len(subtasks)} subtasks on {len(nodes)} distinct nodes; a job of "
                f"{expected} nodes has {expected - 1} subtasks besides the primary"
            )
        return f"primary and {len(subtasks)} subtask(s) exited 0 on {len(nodes)} nodes"

    def _logs(self) -> str:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        url = urllib.parse.urlsplit(self.outputs["job_log_url"])
        account_url = f"{url.scheme}://{url.netloc}"
        folder = url.path.split("/logs/", 1)[1]
        container = self.logs_container(account_url)
        auth_deadline = self.clock() + AUTH_WAIT_SECONDS
        log_deadline = self.clock() + LOG_WAIT_SECONDS
        while True:
            try:
                names = sorted(b.name for b in container.list_blobs(name_starts_with=folder))
            except HttpResponseError as err:
                # 403 until the deployer's Blob Data Reader role and this IP's rule apply.
                if err.status_code != 403 or self.clock() > auth_deadline:
                    raise CheckFailed(
                        f"cannot list {account_url}/logs/{folder} ({err.status_code}): the "
                        "deployer needs Storage Blob Data Reader on the account (acceptance "
                        "stacks grant it) and this machine's IP in storageAllowedIps"
                    ) from None
                self.say(f"logs container answered {err.status_code}; waiting for access")
                self.sleep(POLL_SECONDS)
                continue
            wanted = {f"{folder}stdout.txt", f"{folder}stderr.txt"}
            if wanted <= set(names):
                break
            if self.clock() > log_deadline:
                raise CheckFailed(
                    f"{account_url}/logs/{folder} holds {names or 'nothing'}, not stdout.txt "
                    "and stderr.txt: the task's output files were not uploaded"
                )
            self.sleep(POLL_SECONDS)
        try:
            data = container.download_blob(f"{folder}stdout.txt").readall()
        except ResourceNotFoundError:
            raise CheckFailed(f"{folder}stdout.txt disappeared from the logs container") from None
        self.stdout_text = data.decode("utf-8", errors="replace")
        return f"{', '.join(n.rsplit('/', 1)[1] for n in names)} ({len(data):,} bytes of stdout)"

    def _workers(self) -> str:
        text, count = self.stdout_text, self.settings.cluster.node_count
        sections = {int(m.group(1)) for m in _NODE_SECTION.finditer(text)}
        if sections != set(range(1, count + 1)):
            raise CheckFailed(
                f"the report has logs of nodes {sorted(sections)}, not of all {count} nodes"
            )
        per_node = max(1, size_of(self.settings.cluster.vm_size).gpus)
        started = {int(m.group(1)): int(m.group(3)) for m in _WORKERS_LINE.finditer(text)}
        wrong = {node: n for node, n in started.items() if n != per_node}
        if set(started) != set(range(1, count + 1)) or wrong:
            raise CheckFailed(
                f"workers started per node {started}: expected {per_node} on each of {count}"
            )
        if not re.search(r"^===== attempt \S+: every node finished$", text, re.MULTILINE):
            raise CheckFailed("the report does not end with 'every node finished'")
        return f"{count} nodes x {per_node} worker(s), every node finished"

    def _checkpoint(self) -> str:
        run_folder = f"/{self.outputs['job_checkpoint_path']}/checkpoints/"
        written = {
            path: int(uid)
            for path, uid in _CHECKPOINT_LINE.findall(self.stdout_text)
            if run_folder in path
        }
        wanted = [
            f"step-{step:09d}.pt" for step in expected_checkpoints(self.values["trainerConfig"])
        ]
        names = {path.rsplit("/", 1)[1]: uid for path, uid in written.items()}
        missing = [name for name in wanted if name not in names]
        if missing:
            raise CheckFailed(
                f"no 'checkpoint written' line for {', '.join(missing)} under {run_folder} in "
                "the job's stdout"
            )
        root = [name for name in wanted if names[name] == 0]
        if root:
            raise CheckFailed(f"{', '.join(root)} written as root, not as the task's user")
        uids = sorted({names[name] for name in wanted})
        return f"{', '.join(wanted)} under {run_folder} by uid {', '.join(map(str, uids))}"

    def _gpu_checks(self) -> str:
        size = size_of(self.settings.cluster.vm_size)
        return (
            f"{self.settings.cluster.node_count} nodes ran the task, so each passed its start "
            "task: "
            f"{size.gpus} GPUs, driver, {size.ib_ports} active InfiniBand ports"
        )

    def _preflight(self) -> str:
        from trainer.launch.fabric import preflight_floor

        floor = preflight_floor(self.settings.cluster.vm_size)
        found = [float(v) for v in _PREFLIGHT_LINE.findall(self.stdout_text)]
        if not found:
            raise CheckFailed("no 'preflight: allreduce bus bandwidth' line in the job's stdout")
        if min(found) < floor:
            raise CheckFailed(f"preflight bus bandwidth {min(found):.1f} GB/s < floor {floor}")
        return f"preflight bus bandwidth {min(found):.1f} GB/s (floor {floor} GB/s)"

    def _terminate(self) -> str:
        from azure.core.exceptions import ResourceNotFoundError
        from pulumi.automation import ConfigValue

        from infra.batch import TASK_ID

        first = self.outputs["job_id"]
        long_run = self.opts.profile.long_trainer_config
        self.stack.set_config(f"{PROJECT}:trainerConfig", ConfigValue(value=long_run))
        self.stack.up(
            on_output=self._pulumi_line,
            on_error=self._pulumi_line,
            policy_packs=[str(POLICY_PACK)],
        )
        job_id = self.stack.outputs()["job_id"].value
        if job_id == first:
            raise CheckFailed(f"a new trainerConfig did not replace job {first}")
        deadline = self.clock() + RUNNING_WAIT_SECONDS
        while (task := self._task_state(job_id)) != "running":
            if task == "completed" or self.clock() > deadline:
                raise CheckFailed(f"job {job_id}'s task is {task}, never seen running")
            self.sleep(POLL_SECONDS)
        # `pulumi destroy --target <urn>` deletes that resource alone (nothing depends on the
        # job), through TrainingJobProvider.delete: terminate, delete, wait for Batch's 404. The
        # Batch account must still exist to see the result, hence before the full destroy.
        self.say(f"job {job_id} is running: `pulumi destroy --target` on it")
        self.stack.destroy(
            target=[self._job_urn()], on_output=self._pulumi_line, on_error=self._pulumi_line
        )
        try:
            state = _state(self.client.get_job(job_id).state)
        except ResourceNotFoundError:
            return f"job {job_id} (task {TASK_ID} running) terminated and deleted (404)"
        if state not in ("terminating", "completed", "deleting"):
            raise CheckFailed(f"job {job_id} is still {state} after `pulumi destroy`")
        return f"job {job_id} is {state} after `pulumi destroy`"

    def _job_urn(self) -> str:
        """The TrainingJob's URN from the stack's state (``<stem>-job``, infra/stack.py)."""
        name = f"{prefix(team=self.settings.team, stack=self.settings.stack)}-job"
        resources = (self.stack.export_stack().deployment or {}).get("resources", [])
        urns = [
            r["urn"]
            for r in resources
            if r.get("type") == JOB_TYPE and str(r.get("urn", "")).endswith(f"::{name}")
        ]
        if len(urns) != 1:
            raise CheckFailed(f"found {len(urns)} TrainingJob resources named {name} in the state")
        return urns[0]

    # ---------------------------------------------------------- the end
    def _teardown(self, failed: bool) -> Result:
        check = next(c for c in CHECKS if c.key == "destroy")
        name = self.opts.stack_name
        if failed and self.opts.keep_on_failure:
            self.say(
                f"a check failed and --keep-on-failure is set: stack {name} is left as it is; "
                f"remove it with `pulumi destroy --stack {name} --yes && pulumi stack rm "
                f"{name} --yes`"
            )
            return Result(check, "NOT RUN", "--keep-on-failure")
        self.say(f"pulumi destroy of {name}, then stack rm")
        try:
            self.stack.destroy(on_output=self._pulumi_line, on_error=self._pulumi_line)
            self.stack.workspace.remove_stack(name)
        except Exception as err:
            group = f"rg-{prefix(team=self.settings.team, stack=self.settings.stack)}"
            return Result(
                check,
                "FAIL",
                f"{_one_line(err)}; finish by hand: `pulumi destroy --stack {name} --yes`, "
                f"`pulumi stack rm {name} --yes` (or `az group delete -n {group}`)",
            )
        return Result(check, "PASS", f"stack {name} destroyed and removed")

    def _summary(self, results: list[Result], hours: float, node_hours: float) -> None:
        w = self.out.write
        w(
            f"\nAcceptance results (profile {self.opts.profile.name}, "
            f"stack {self.opts.stack_name}):\n"
        )
        for r in results:
            w(f"  {r.status:<8} {r.check.title:<28} {r.detail}\n")
        minutes = hours * 60
        total = cost.total(run_cost(self.settings, hours, node_hours, self.build_minutes))
        time_note = cost_note = ""
        if self.opts.profile.target is not None:
            target_minutes, target_usd = self.opts.profile.target
            time_note = f" (target: under {target_minutes} min" + (
                ", over it)" if minutes > target_minutes else ")"
            )
            cost_note = f" (target: under ${target_usd:.0f}" + (
                ", over it)" if total > target_usd else ")"
            )
        seconds = round(hours * 3600)
        w(f"Time: {seconds // 60} min {seconds % 60} s{time_note}\n")
        w(f"Estimated cost: ${total:.2f}{cost_note}\n")
        w("\n".join(cost_lines(self.settings, hours, node_hours, self.build_minutes)) + "\n")
        self.out.flush()


# ---------------------------------------------------------------- this machine
def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))


def _public_ip() -> str:
    """This machine's public IPv4 address as the internet sees it (what a storage IP rule
    matches)."""
    with urllib.request.urlopen("https://api.ipify.org", timeout=15) as response:
        return response.read().decode().strip()


def _check_source() -> None:
    """The acr builder builds the deployed commit: refuse uncommitted or unpushed image inputs
    now (``ConfigError``), as `pulumi up` would, before anything is created."""
    from infra.image import commit_to_build

    commit_to_build(strict=True)


@dataclass(frozen=True)
class Host:
    """What a real run asks of this machine; tests pass fakes."""

    which: Callable[[str], str | None] = shutil.which
    run: Callable[[list[str]], subprocess.CompletedProcess[str]] = _run
    public_ip: Callable[[], str] = _public_ip
    check_source: Callable[[], None] = _check_source
    env: Mapping[str, str] = field(default_factory=dict)


def prerequisites(host: Host, secrets_provider: str | None) -> None:
    """The Pulumi CLI logged in (with a way to encrypt the stack's secrets on a self-managed
    backend) and an Azure CLI login; raises ``Unavailable`` with the fix."""
    if host.which("pulumi") is None:
        raise Unavailable(
            "the Pulumi CLI is not on PATH: install it (https://www.pulumi.com/docs/install/), "
            "then pulumi login"
        )
    whoami = host.run(["pulumi", "whoami", "--json"])
    if whoami.returncode != 0:
        raise Unavailable(
            "pulumi is not logged in to a state backend: run pulumi login (Pulumi Cloud or "
            "azblob://<container>?storage_account=<account>)"
        )
    try:
        backend = str(json.loads(whoami.stdout).get("url", ""))
    except ValueError:
        backend = ""
    self_managed = not backend.startswith("https://")
    passphrase = host.env.get("PULUMI_CONFIG_PASSPHRASE") is not None or bool(
        host.env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    )
    if self_managed and not secrets_provider and not passphrase:
        raise Unavailable(
            f"the state backend {backend or '(self-managed)'} encrypts stack secrets with a "
            "passphrase: set PULUMI_CONFIG_PASSPHRASE (or _FILE), or pass --secrets-provider "
            "azurekeyvault://<vault>.vault.azure.net/keys/<key>"
        )
    if host.which("az") is None:
        raise Unavailable("the Azure CLI (az) is not on PATH: install it, then az login")
    if host.run(["az", "account", "show", "-o", "none"]).returncode != 0:
        raise Unavailable("az is not logged in: run az login (and az account set -s <id>)")


def resolve_options(args: argparse.Namespace, host: Host, *, look_up: bool) -> Options:
    """The options of a run. Without ``look_up`` (a dry run, or the input check before the
    prerequisites) nothing is asked of az or the internet: placeholders stand in, named as
    such; with it, git, az and the internet are asked, failing before anything is created."""
    profile = PROFILES[args.profile]
    vm_size = args.vm_size or profile.vm_size
    if profile.name == "cpu" and vm_size not in CPU_ACCEPTANCE:
        raise InputError(
            f"--vm-size={vm_size}: the cpu profile runs on {', '.join(CPU_ACCEPTANCE)}"
        )
    if profile.name == "gpu" and vm_size not in SUPPORTED:
        raise InputError(
            f"--vm-size={vm_size}: the gpu profile needs an InfiniBand GPU size, one of "
            f"{', '.join(SUPPORTED)}"
        )
    image_ref, registry_id = args.image_ref or "", ""
    placeholders = {}
    if image_ref:
        registry_id = reused_registry(image_ref, host, look_up=look_up)
        if not look_up:
            placeholders["imageRegistryId"] = "placeholder: a real run asks az acr show"
    repo = args.image_source_repo
    if repo is None and args.image_builder == "acr" and not image_ref:
        remote = host.run(["git", "-C", str(REPO), "remote", "get-url", "origin"])
        repo = git_https_url(remote.stdout) if remote.returncode == 0 else None
        if repo is None and look_up:
            raise InputError(
                "--image-source-repo: the acr builder clones this repository and no https or "
                "ssh `origin` remote says where it is; pass https://.../<repo>.git"
            )
    email = args.budget_email
    if email is None and look_up:
        account = host.run(["az", "account", "show", "--query", "user.name", "-o", "tsv"])
        email = account.stdout.strip()
        if account.returncode != 0 or "@" not in email:
            raise InputError(
                "--budget-email: the signed-in az account has no e-mail address "
                f"({email or 'none'}); pass the address the stack's budget alerts"
            )
    client_ip = args.client_ip
    if client_ip is None and look_up:
        try:
            client_ip = host.public_ip()
        except OSError as err:
            raise Unavailable(
                f"cannot look up this machine's public IP ({err}): pass --client-ip"
            ) from None
    if email is None:
        placeholders["budgetEmails"] = "placeholder: a real run alerts your az login's e-mail"
    if repo is None and args.image_builder == "acr" and not image_ref:
        placeholders["imageSourceRepo"] = "placeholder: a real run reads the origin remote"
    token = None
    if args.image_source_token_env:
        token = host.env.get(args.image_source_token_env)
        if not token:
            raise InputError(f"--image-source-token-env={args.image_source_token_env}: not set")
    return Options(
        profile=profile,
        stack_name=stack_name(profile.name),
        location=args.location,
        vm_size=vm_size,
        # Placeholders for the dry run only, shown as such in its config listing.
        budget_email=email or "you@example.com",
        image_builder=args.image_builder,
        image_source_repo=repo or "https://github.com/<your-org>/<repo>.git",
        ssh_public_key=throwaway_ssh_key(),
        client_ip=client_ip,
        keep_on_failure=args.keep_on_failure,
        secrets_provider=args.secrets_provider,
        image_source_token=token,
        image_ref=image_ref,
        image_registry_id=registry_id,
        placeholders=placeholders,
    )


ASSIGN_ROLES = "Microsoft.Authorization/roleAssignments/write"
# ARM's Permissions - List For Resource: the caller's actions and notActions at a scope, one
# entry per role it holds there (REST reference, authorization/permissions, 2022-04-01).
PERMISSIONS_API = "providers/Microsoft.Authorization/permissions?api-version=2022-04-01"
PLACEHOLDER_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"


def may_assign_roles(permissions: list[Mapping[str, Any]]) -> bool:
    """Whether one of the caller's roles at a scope grants ``roleAssignments/write`` through an
    action pattern (``*`` wildcards, case-insensitive) that its own notActions do not take
    back: Contributor's ``Microsoft.Authorization/*/Write`` does. Deny assignments and role
    conditions are not in this answer: ARM may still refuse what it allows."""

    def granted(patterns: Any) -> bool:
        return any(
            fnmatch.fnmatchcase(ASSIGN_ROLES.lower(), str(p).lower()) for p in patterns or ()
        )

    return any(granted(p.get("actions")) and not granted(p.get("notActions")) for p in permissions)


def reused_registry(image_ref: str, host: Host, *, look_up: bool) -> str:
    """The ARM id of ``--image-ref``'s registry, where the nodes' identity will get AcrPull;
    ``InputError`` (exit 2, nothing created) for a ref without a digest, outside ACR, in a
    registry az cannot find, or one where this login may not assign roles. Without
    ``look_up``, a placeholder id."""
    parts = acr_image(image_ref)
    if parts is None or not parts["digest"]:
        raise InputError(
            f"--image-ref={image_ref}: give <name>.azurecr.io/<repository>@sha256:<digest>; the "
            "check holds a run to one image, which only a digest names"
        )
    name = parts["registry"]
    if not look_up:
        return (
            f"/subscriptions/{PLACEHOLDER_SUBSCRIPTION}/resourceGroups/placeholder/providers/"
            f"Microsoft.ContainerRegistry/registries/{name}"
        )
    shown = host.run(["az", "acr", "show", "-n", name, "--query", "id", "-o", "tsv"])
    registry_id = shown.stdout.strip()
    if shown.returncode != 0 or not registry_id:
        raise InputError(
            f"--image-ref={image_ref}: az acr show -n {name} finds no registry this login can "
            f"read in the selected subscription ({one_line(shown.stderr.strip()[:160])}); use "
            "an image in a registry of this subscription"
        )
    url = f"https://management.azure.com{registry_id}/{PERMISSIONS_API}"
    answer = host.run(["az", "rest", "--method", "get", "--url", url])
    try:
        permissions = json.loads(answer.stdout)["value"]
    except (ValueError, KeyError, TypeError):
        permissions = []
    if answer.returncode != 0 or not may_assign_roles(permissions):
        raise InputError(
            f"--image-ref={image_ref}: this login may not assign roles on registry {name} "
            f"({ASSIGN_ROLES}), so the nodes could not get AcrPull there; ask for Role Based "
            "Access Control Administrator (or User Access Administrator) on it, or use an "
            "image in a registry you may grant"
        )
    return registry_id


def open_stack(name: str, secrets_provider: str | None) -> Any:
    """A new stack of this project through the Automation API. ``create_stack`` rather than
    ``create_or_select_stack``: selecting an existing stack of the same name would end with
    destroying it. The Automation API drives the Pulumi CLI, which must be installed; a
    LocalWorkspace on this directory keeps the stack's config in ``Pulumi.<stack>.yaml`` here
    (Pulumi docs, "Automation API concepts & terminology"), which ``pulumi stack rm`` deletes
    with the stack (.gitignore keeps it out of commits meanwhile)."""
    from pulumi import automation as auto

    return auto.create_stack(
        stack_name=name,
        work_dir=str(REPO),
        opts=auto.LocalWorkspaceOptions(secrets_provider=secrets_provider),
    )


def _batch_client(endpoint: str) -> Any:
    from infra import batch  # the job resource's client: same SDK, same credential

    return batch.client(endpoint)


def _logs_container(account_url: str) -> Any:
    from azure.storage.blob import ContainerClient

    from infra import credentials  # the process's one credential, as the job resource's

    return ContainerClient(account_url, "logs", credential=credentials.credential())


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m dt_commands.acceptance",
        description="Create a throwaway stack, run a small training job through it, check the "
        "outcome, check destroy stops a running job, destroy the stack.",
        allow_abbrev=False,
    )
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES))
    parser.add_argument(
        "--dry-run", action="store_true", help="print what it would create and check; no Azure"
    )
    parser.add_argument("--location", default="eastus", help="Azure region (default eastus)")
    parser.add_argument("--vm-size", help="gpu profile: another InfiniBand GPU size")
    parser.add_argument(
        "--keep-on-failure",
        action="store_true",
        help="leave the stack in place when a check fails, to look at it",
    )
    parser.add_argument("--budget-email", help="who the budget alerts (default: your az login)")
    parser.add_argument("--client-ip", help="this machine's public IP (default: looked up)")
    parser.add_argument("--image-builder", choices=("acr", "docker"), default="acr")
    parser.add_argument(
        "--image-source-repo", help="https://.../<repo>.git for the acr builder (default: origin)"
    )
    parser.add_argument(
        "--image-source-token-env",
        metavar="VAR",
        help="environment variable holding a read token for a private repository",
    )
    parser.add_argument(
        "--image-ref",
        metavar="REF",
        help="run this image (<name>.azurecr.io/<repository>@sha256:<digest>) instead of "
        "building one; the nodes get AcrPull on its registry",
    )
    parser.add_argument(
        "--secrets-provider", help="for the new stack, e.g. azurekeyvault://<vault>/keys/<key>"
    )
    return parser


def main(
    argv: list[str] | None = None,
    *,
    host: Host | None = None,
    stack_factory: Callable[[str, str | None], Any] = open_stack,
    batch_client: Callable[[str], Any] = _batch_client,
    logs_container: Callable[[str], Any] = _logs_container,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    targets: Callable[[Options, dict[str, Any]], list[str]] = _plan_targets,
) -> int:
    import os

    args = build_parser().parse_args(argv)
    host = host or Host(env=dict(os.environ))
    stream: TextIO = out or sys.stdout
    try:
        # Input first (offline), then what this machine must have, then the look-ups.
        opts = resolve_options(args, host, look_up=False)
        values = stack_values(opts)
        validated(opts, values)
        if args.dry_run:
            describe(opts, values, stream)
            return 0
        prerequisites(host, args.secrets_provider)
        opts = resolve_options(args, host, look_up=True)
        values = stack_values(opts)
        validated(opts, values)
        if opts.image_builder == "acr" and not opts.image_ref:
            host.check_source()
        staged = targets(opts, values)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except InputError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except Unavailable as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 1
    try:
        stack = stack_factory(opts.stack_name, opts.secrets_provider)
    except Exception as err:
        print(f"error: cannot create stack {opts.stack_name}: {_one_line(err)}", file=sys.stderr)
        return 1
    runner = Acceptance(
        opts,
        values,
        stack,
        batch_client=batch_client,
        logs_container=logs_container,
        out=stream,
        run=host.run,
        sleep=sleep,
        clock=clock,
        targets=staged,
    )
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
