"""python -m dt_commands.acceptance at the Automation API boundary: a fake
``pulumi.automation.Stack`` (its methods and keywords checked against the real class), autospecs
of the real ``BatchClient`` and ``ContainerClient`` answering with the SDK's own models, and the
job's stdout made by the launcher's real report. Plus the dry run of both profiles as a subprocess,
the one-line failures, the cost and time summary, and the presets through the trainer."""

from __future__ import annotations

import functools
import inspect
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest.mock import create_autospec

import pytest
from azure.batch import BatchClient
from azure.batch import models as m
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob import ContainerClient
from pulumi import automation as auto

from dt_commands.acceptance import checks
from dt_commands.acceptance import main as acceptance
from dt_commands.acceptance.cost import run_cost
from dt_commands.acceptance.host import Host, may_assign_roles
from dt_commands.acceptance.options import config_map, expected_checkpoints, stack_values, validated
from dt_commands.acceptance.plan import BATCH_ACCOUNT_TYPE, account_targets, engine_urn
from dt_commands.acceptance.profiles import CHECKS, POLICY_PACK, PROFILES
from dt_commands.acceptance.run import JOB_TYPE
from dt_commands.plan import evaluate
from infra import cost
from infra.batch import CPU_CONTAINER_RUN_OPTIONS
from infra.node_checks import CPU_SKIP_MESSAGE
from infra.sizes import size_of
from tests.support.stacks import (
    CLIENT_IP,
    REPO,
    acceptance_options,
    acceptance_values,
    of_type,
    one,
)
from trainer.checkpoints.checkpointer import CHECKPOINT_WRITTEN
from trainer.launch.records import Outcome, RunRecords
from trainer.settings.flags import parse

PROJECT_PREFIX = "gpu-cluster:"


# ---------------------------------------------------------------- fakes
class FakeClock:
    """Monotonic time that moves only when the run sleeps or a fake operation takes time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeWorkspace:
    def __init__(self, stack: FakeStack) -> None:
        self.stack = stack

    def remove_stack(self, stack_name: str, force=None, preserve_config=None) -> None:
        self.stack.record("remove_stack", stack_name)


class FakeStack:
    """What the runner asks of ``pulumi.automation.Stack``: the same method names and
    keywords (``test_the_fake_stack_matches_the_automation_api`` checks them)."""

    def __init__(self, name: str, world: World) -> None:
        self.name, self.world = name, world
        self.workspace = FakeWorkspace(self)
        self.calls: list[tuple] = []
        self.keywords: dict[str, set[str]] = {}
        self.config: dict[str, auto.ConfigValue] = {}
        self.policy_packs: list = []

    def record(self, method: str, *args, **kwargs) -> None:
        self.calls.append((method, *args))
        self.keywords.setdefault(method, set()).update(kwargs)

    def set_all_config(self, config, *, path=False) -> None:
        self.record("set_all_config", path=path)
        self.config.update(config)

    def set_config(self, key, value, *, path=False) -> None:
        self.record("set_config", key, value.value)
        self.config[key] = value

    def up(self, **kwargs) -> SimpleNamespace:
        preset = self.config[f"{PROJECT_PREFIX}trainerConfig"].value
        targets = list(kwargs.get("target") or ())
        self.record("up", preset, *(["targeted"] if targets else []), **kwargs)
        self.policy_packs.append(kwargs.get("policy_packs"))
        if targets:
            return self.world.targeted_up(self.name, targets)
        self.world.clock.now += 20 * 60 if len([c for c in self.calls if c[0] == "up"]) == 1 else 60
        if self.world.fail_up:
            raise auto.CommandError(
                auto.CommandResult(
                    "Updating (acceptance)\n", "error: resource x failed\n  detail line\n", 255
                )
            )
        self.world.created |= set(self.world.graph(self.name))
        self.world.submit(preset)
        return SimpleNamespace(summary=SimpleNamespace(resource_changes={"create": 47}))

    def outputs(self) -> dict[str, auto.OutputValue]:
        self.record("outputs")
        return {k: auto.OutputValue(v, False) for k, v in self.world.outputs().items()}

    def export_stack(self) -> auto.Deployment:
        self.record("export_stack")
        stem = self.name  # team "acceptance" with a stack named acceptance-*: no prefix added
        resources = [
            {"urn": f"urn:pulumi:{self.name}::gpu-cluster::pulumi:pulumi:Stack::x", "type": "x"},
            {
                "urn": f"urn:pulumi:{self.name}::gpu-cluster::{JOB_TYPE}::{stem}-job",
                "type": JOB_TYPE,
            },
        ]
        return auto.Deployment(version=3, deployment={"resources": resources})

    def destroy(self, **kwargs) -> None:
        self.record("destroy", tuple(kwargs.get("target") or ()), **kwargs)
        self.world.clock.now += 600
        if kwargs.get("target"):
            self.world.deleted.add(self.world.job_id)


@dataclass
class World:
    """The Azure side: the stack's outputs, the Batch jobs and the logs container."""

    tmp_path: object
    profile: str = "cpu"
    clock: FakeClock = field(default_factory=FakeClock)
    fail_up: bool = False
    subtask_exit: int = 0
    checkpoint_uid: int = 1001
    preflight_gbps: float | None = None
    forbidden_first: int = 0  # 403s from the logs container before the role applies
    job_id: str = ""
    stack_name: str = ""
    jobs: dict[str, list[str]] = field(default_factory=dict)  # states still to report
    deleted: set[str] = field(default_factory=set)
    stdout: str = ""
    # The Batch account's quotas from the moment it exists (az batch account show's answer).
    quota: str = ""
    created: set[str] = field(default_factory=set)  # URNs in the stack's state
    image_ref: str = ""  # --image-ref: the image the stack runs

    # -- the Pulumi engine's targeted update
    def graph(self, stack: str) -> dict[str, set[str]]:
        """URN -> the URNs it needs in the state first (dependencies and parent), from the
        program as the offline plan runs it, named for ``stack`` as the engine names them."""
        nodes = profile_plan(self.profile, self.image_ref).registered
        plan_stack = acceptance_options(self.profile).stack_name

        def named(urn: str) -> str:  # resource names start with the stack's name
            return engine_urn(nodes, urn, plan_stack).replace(plan_stack, stack)

        return {
            named(urn): {
                named(d)
                for d in (*node.dependencies, node.parent)
                if d in nodes and nodes[d].typ != "pulumi:pulumi:Stack"
            }
            for urn, node in nodes.items()
            if node.typ != "pulumi:pulumi:Stack"
        }

    def targeted_up(self, stack: str, targets: list[str]) -> SimpleNamespace:
        """`pulumi up --target`: a targeted resource whose dependency or parent is neither
        targeted nor in the state fails the update (pulumi/pulumi #5869, #3369; a parent:
        #14531); an unknown URN creates nothing."""
        graph = self.graph(stack)
        self.clock.now += 4 * 60
        for urn in targets:
            for needed in sorted(graph.get(urn, ())):
                if needed not in self.created and needed not in targets:
                    raise auto.CommandError(
                        auto.CommandResult(
                            "Updating (acceptance)\n",
                            f"error: Resource '{urn}' depends on '{needed}' which was was not "
                            "specified in --target list.\n",
                            255,
                        )
                    )
        known = [urn for urn in targets if urn in graph]
        self.created |= set(known)
        return SimpleNamespace(summary=SimpleNamespace(resource_changes={"create": len(known)}))

    def account_exists(self) -> bool:
        return any(urn.split("::")[2].endswith(BATCH_ACCOUNT_TYPE) for urn in self.created)

    def az_batch_account_show(self) -> tuple[int, str, str]:
        """ARM's answer through az: 404 ResourceNotFound until the account exists
        (articles/azure-resource-manager/troubleshooting/error-not-found.md); then its
        quotas, which Batch sets when it creates the account: "0-900" dedicated cores by
        default, reduced for new accounts in some regions and subscriptions, "in some cases
        to zero" (articles/batch/batch-quota-limit.md, footnote 1). Nothing tells them
        before the account exists."""
        if not self.account_exists():
            return 3, "", "ERROR: (ResourceNotFound) The Resource was not found.\n"
        return 0, self.quota or QUOTA, ""

    def submit(self, preset: str) -> None:
        self.job_id = f"{self.stack_name}-{'long' if 'long' in preset else 'first'}"
        if "long" in preset:
            self.jobs[self.job_id] = ["active"]
        else:
            self.jobs[self.job_id] = ["active", "active", "completed"]

    @property
    def settings(self):
        opts = acceptance_options(self.profile, **reused(self.image_ref))
        return validated(opts, stack_values(opts))

    def outputs(self) -> dict:
        name = self.stack_name
        return {
            "job_id": self.job_id,
            "job_state": "active",
            "job_log_url": f"https://acceptancedata1234abcd.blob.core.windows.net/logs/{self.job_id}/",
            "job_checkpoint_path": f"shared/runs/{name}/0a21bb731886",
            "job_portal_url": "https://portal.azure.com/#resource/x/jobs",
            "image_ref": self.image_ref
            or "acceptanceacr1234abcd.azurecr.io/trainer:abc@sha256:" + "a" * 64,
            "batch_account_endpoint": "acceptancebatch1234abcd.eastus.batch.azure.com",
            "storage_account_name": "acceptancedata1234abcd",
            "resource_group_name": f"rg-{name}",
            "vm_size": PROFILES[self.profile].vm_size,
            "node_count": 2,
        }

    # -- Batch (behind an autospec of the real BatchClient)
    def get_job(self, job_id, **kwargs):
        if job_id in self.deleted:
            raise ResourceNotFoundError("The specified job does not exist.")
        states = self.jobs[job_id]
        state = states.pop(0) if len(states) > 1 else states[0]
        return m.BatchJob(id=job_id, state=state)

    def get_task(self, job_id, task_id, **kwargs):
        assert task_id == "train"
        done = self.jobs[job_id][0] == "completed"
        return m.BatchTask(
            id=task_id,
            state="completed" if done else "running",
            execution_info=m.BatchTaskExecutionInfo(
                exit_code=0 if done else None, retry_count=0, requeue_count=0
            ),
            node_info=m.BatchNodeInfo(node_id="tvm-0"),
        )

    def list_subtasks(self, job_id, task_id, **kwargs):
        return [
            m.BatchSubtask(
                id=1,
                state="completed",
                exit_code=self.subtask_exit,
                node_info=m.BatchNodeInfo(node_id="tvm-1"),
            )
        ]

    def batch_client(self, endpoint: str):
        assert endpoint == "acceptancebatch1234abcd.eastus.batch.azure.com"
        client = create_autospec(BatchClient, instance=True)
        client.get_job.side_effect = self.get_job
        client.get_task.side_effect = self.get_task
        client.list_subtasks.side_effect = self.list_subtasks
        self.client = client
        return client

    # -- Blob (behind an autospec of the real ContainerClient)
    def list_blobs(self, name_starts_with=None, **kwargs):
        if self.forbidden_first:
            self.forbidden_first -= 1
            error = HttpResponseError("This request is not authorized")
            error.status_code = 403
            raise error
        names = [f"{self.job_id}/stdout.txt", f"{self.job_id}/stderr.txt"]
        return [SimpleNamespace(name=n) for n in names if n.startswith(name_starts_with)]

    def download_blob(self, blob, **kwargs):
        assert blob == f"{self.job_id}/stdout.txt"
        self.stdout = job_stdout(self)
        return SimpleNamespace(readall=lambda: self.stdout.encode())

    def logs_container(self, account_url: str):
        assert account_url == "https://acceptancedata1234abcd.blob.core.windows.net"
        container = create_autospec(ContainerClient, instance=True)
        container.list_blobs.side_effect = self.list_blobs
        container.download_blob.side_effect = self.download_blob
        self.container = container
        return container


def job_stdout(world: World) -> str:
    """The primary's stdout as trainer.launch --report writes it, from node logs with the
    lines the launcher and the trainer print."""
    profile = PROFILES[world.profile]
    run = world.tmp_path / "fsmounts" / world.outputs()["job_checkpoint_path"]  # type: ignore[operator]
    records = RunRecords(run)
    hosts = ["10.20.0.4", "10.20.0.5"]
    attempt = RunRecords.new_attempt()
    records.start(attempt, hosts, {"AZ_BATCH_JOB_ID": world.job_id})
    workers = max(1, size_of(profile.vm_size).gpus)
    for index, host in enumerate(hosts):
        lines = [f"[launch {host}] node {index + 1}/2: starting {workers} worker(s) ({attempt})"]
        if index == 0:
            if world.preflight_gbps is not None:
                bandwidth = f"{world.preflight_gbps:.2f} GB/s"
                lines.append(f"[rank 0] INFO preflight: allreduce bus bandwidth {bandwidth}")
            for step in expected_checkpoints(profile.trainer_config):
                path = run / "checkpoints" / f"step-{step:09d}.pt"
                lines.append("[rank 0] INFO " + CHECKPOINT_WRITTEN % (path, world.checkpoint_uid))
        lines.append(f"[launch {host}] done: node {host}: every worker finished (exit 0)")
        log = records.log_path(attempt, host)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(lines) + "\n")
        records.finish(attempt, host, Outcome(0, f"node {host}: every worker finished"))
    out = io.StringIO()
    env = {"AZ_BATCH_HOST_LIST": ",".join(hosts), "AZ_BATCH_JOB_ID": world.job_id}
    assert records.report(env, out) == 0
    return out.getvalue()


REUSED_REGISTRY_ID = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-images/providers/"
    "Microsoft.ContainerRegistry/registries/teamimages"
)
REUSED_REF = "teamimages.azurecr.io/trainer@sha256:" + "3f" * 32
# Permissions - List For Resource (authorization REST reference, 2022-04-01): one entry per
# role the caller holds at the scope, with that role's actions and notActions. Contributor's
# notActions take back role assignments; Role Based Access Control Administrator grants them.
CONTRIBUTOR = {
    "actions": ["*"],
    "notActions": [
        "Microsoft.Authorization/*/Delete",
        "Microsoft.Authorization/*/Write",
        "Microsoft.Authorization/elevateAccess/Action",
    ],
}
RBAC_ADMIN = {
    "actions": ["Microsoft.Authorization/roleAssignments/write", "*/read"],
    "notActions": [],
}
FAMILIES = {
    "Standard_D2ds_v5": "standardDDSv5Family",
    "Standard_ND96asr_v4": "standardNDASv4_A100Family",
}
QUOTA = (
    '{"total": 500, "enforced": true, "families": [{"name": "standardDDSv5Family", "coreQuota": '
    '100}, {"name": "standardNDASv4_A100Family", "coreQuota": 192}]}'
)


@functools.cache
def profile_plan(profile: str, image_ref: str = ""):
    """The acceptance profile's program under mocks, once per session."""
    opts = acceptance_options(profile, **reused(image_ref))
    return evaluate(opts.stack_name, stack_values(opts))


def reused(image_ref: str) -> dict:
    """The options --image-ref sets (with the registry id az acr show gives)."""
    return {"image_ref": image_ref, "image_registry_id": REUSED_REGISTRY_ID if image_ref else ""}


def good_host(world: World | None = None, **changes) -> Host:
    """A machine with both CLIs logged in (Pulumi Cloud backend) and an origin remote; with
    ``world``, az answers for its Batch account as ARM would."""
    answers = {
        ("pulumi", "whoami"): (0, '{"user": "me", "url": "https://app.pulumi.com/me"}'),
        ("az", "account"): (0, "qa@example.com\n"),
        ("az", "vm"): (0, ""),
        ("az", "batch"): (0, QUOTA),
        ("git", "-C"): (0, "git@github.com:example-org/distributed-training.git\n"),
        ("az", "acr"): (0, REUSED_REGISTRY_ID + "\n"),
        ("az", "rest"): (0, json.dumps({"value": [CONTRIBUTOR, RBAC_ADMIN]})),
    }
    fixed = changes.pop("answers", {})
    answers.update(fixed)

    def run(argv):
        code, out, err = (*answers[tuple(argv[:2])], "")[:3]
        if argv[:3] == ["az", "vm", "list-skus"]:  # the family of the size asked about
            out = FAMILIES[argv[argv.index("--size") + 1]] + "\n"
        if argv[:3] == ["az", "batch", "account"] and world and ("az", "batch") not in fixed:
            code, out, err = world.az_batch_account_show()
        return subprocess.CompletedProcess(argv, code, out, err)

    values = {
        "which": lambda name: f"/usr/bin/{name}",
        "run": run,
        "public_ip": lambda: CLIENT_IP,
        "check_source": lambda: None,
        "env": {},
    }
    return Host(**{**values, **changes})


def run_main(
    world: World, *argv: str, host: Host | None = None, targets=None
) -> tuple[int, str, list]:
    stacks: list[FakeStack] = []

    def factory(name, secrets_provider):
        assert secrets_provider is None
        world.stack_name = name
        stacks.append(FakeStack(name, world))
        return stacks[-1]

    def staged(opts, values):
        plan_stack = acceptance_options(world.profile).stack_name
        urns = account_targets(profile_plan(world.profile, world.image_ref), plan_stack)
        return [
            urn.replace(plan_stack, opts.stack_name)
            for urn in urns
            if targets is None or targets(urn)
        ]

    out = io.StringIO()
    code = acceptance.main(
        ["--profile", world.profile, *argv],
        host=host or good_host(world),
        targets=staged,
        stack_factory=factory,
        batch_client=world.batch_client,
        logs_container=world.logs_container,
        out=out,
        sleep=world.clock.sleep,
        clock=world.clock,
    )
    return code, out.getvalue(), stacks


def results(text: str) -> dict[str, str]:
    """Check title -> status, from the summary table."""
    table = text.split("Acceptance results", 1)[1]
    found = {}
    for check in CHECKS:
        match = re.search(
            rf"^  (PASS|FAIL|SKIPPED|NOT RUN)\s+{re.escape(check.title)}", table, re.M
        )
        assert match, check.title
        found[check.key] = match.group(1)
    return found


# ---------------------------------------------------------------- the whole sequence
def test_a_passing_cpu_run_calls_the_automation_api_in_order_and_always_cleans_up(tmp_path):
    world = World(tmp_path)
    code, text, (stack,) = run_main(world)
    assert code == 0, text
    name = stack.name
    assert re.fullmatch(r"acceptance-cpu-\d{8}-\d{6}", name)
    first, long_run = f"{name}-first", f"{name}-long"
    job_urn = f"urn:pulumi:{name}::gpu-cluster::{JOB_TYPE}::{name}-job"
    assert stack.calls == [
        ("set_all_config",),
        # The Batch account and what it needs first: its quota is read before the build.
        ("up", "trainer/presets/acceptance-cpu.yaml", "targeted"),
        ("up", "trainer/presets/acceptance-cpu.yaml"),
        ("outputs",),
        ("set_config", "gpu-cluster:trainerConfig", "trainer/presets/acceptance-cpu-long.yaml"),
        ("up", "trainer/presets/acceptance-cpu-long.yaml"),
        ("outputs",),
        ("export_stack",),
        ("destroy", (job_urn,)),  # the running job first, by itself
        ("destroy", ()),  # then everything
        ("remove_stack", name),
    ]
    config = {key: value.value for key, value in stack.config.items()}
    assert config["gpu-cluster:acceptanceProfile"] == "cpu"
    assert config["gpu-cluster:vmSize"] == "Standard_D2ds_v5"
    assert config["gpu-cluster:protectData"] == "false"
    assert config["gpu-cluster:storageAllowedIps[0]"] == CLIENT_IP
    assert config["gpu-cluster:budgetEmails[0]"] == "qa@example.com"  # from az account show
    assert config["gpu-cluster:imageSourceRepo"] == (
        "https://github.com/example-org/distributed-training.git"  # the ssh origin, as https
    )
    assert stack.keywords["set_all_config"] == {"path"}
    assert stack.policy_packs == [[str(POLICY_PACK)]] * 3  # the guardrails on every up
    # Batch: the first job polled to completed, its subtasks read; the long one gone (404).
    client = world.client
    job_polls = [c.args[0] for c in client.get_job.call_args_list]
    assert job_polls.count(first) == 3 and job_polls[-1] == long_run
    client.list_subtasks.assert_called_once_with(first, "train")
    world.container.list_blobs.assert_called_with(name_starts_with=f"{first}/")
    world.container.download_blob.assert_called_once_with(f"{first}/stdout.txt")
    status = results(text)
    assert status == {
        **{check.key: "PASS" for check in CHECKS},
        "gpu-checks": "SKIPPED",
        "preflight": "SKIPPED",
    }
    assert CPU_SKIP_MESSAGE in text  # why the GPU checks are skipped, visibly
    assert "step-000000010.pt, step-000000020.pt under" in text and "by uid 1001" in text
    assert "2 nodes x 1 worker(s), every node finished" in text
    assert f"job {long_run} (task train running) terminated and deleted (404)" in text


def test_the_policy_pack_and_the_stack_methods_are_the_real_ones(tmp_path):
    world = World(tmp_path)
    _, _, (stack,) = run_main(world)
    for method, keywords in stack.keywords.items():
        owner = auto.LocalWorkspace if method == "remove_stack" else auto.Stack
        parameters = inspect.signature(getattr(owner, method)).parameters
        assert keywords <= set(parameters), (method, keywords - set(parameters))
    assert POLICY_PACK == REPO / "policy" and (POLICY_PACK / "PulumiPolicy.yaml").is_file()


def test_a_failed_check_still_destroys_and_removes_the_stack(tmp_path):
    world = World(tmp_path, subtask_exit=1)
    code, text, (stack,) = run_main(world)
    assert code == 1
    assert [c[0] for c in stack.calls][-2:] == ["destroy", "remove_stack"]
    assert ("set_config",) not in [c[:1] for c in stack.calls]  # no long run after a failure
    status = results(text)
    assert status["nodes"] == "FAIL" and status["destroy"] == "PASS"
    assert status["logs"] == status["terminate"] == "NOT RUN"
    assert "subtask 1 on node tvm-1: completed, exit code 1" in text
    assert "Estimated cost: $" in text


def test_keep_on_failure_leaves_the_stack_and_says_how_to_remove_it(tmp_path):
    world = World(tmp_path, checkpoint_uid=0)  # written as root: a failed check
    code, text, (stack,) = run_main(world, "--keep-on-failure")
    assert code == 1
    assert "destroy" not in [c[0] for c in stack.calls]
    assert "remove_stack" not in [c[0] for c in stack.calls]
    assert results(text)["checkpoint"] == "FAIL"
    assert "written as root, not as the task's user" in text
    assert f"pulumi destroy --stack {stack.name} --yes && pulumi stack rm {stack.name}" in text
    # A passing run is destroyed even with --keep-on-failure.
    code, _, (again,) = run_main(World(tmp_path / "2"), "--keep-on-failure")
    assert code == 0 and again.calls[-1] == ("remove_stack", again.name)


def test_a_failed_pulumi_up_is_one_line_and_the_stack_is_still_destroyed(tmp_path):
    world = World(tmp_path, fail_up=True)
    code, text, (stack,) = run_main(world)
    assert code == 1
    assert [c[0] for c in stack.calls] == ["set_all_config", "up", "up", "destroy", "remove_stack"]
    line = next(line for line in text.splitlines() if line.startswith("  FAIL"))
    assert line.endswith("CommandError: error: resource x failed")


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        ('{"total": 500, "enforced": true, "families": []}', "has 0 dedicated cores of"),
        (
            '{"total": 2, "enforced": false, "families": []}',
            "has 2 dedicated cores of standardDDSv5Family (2 in total); the pool needs 4",
        ),
    ],
)
def test_a_new_batch_account_without_quota_fails_before_the_pool_and_the_build(
    tmp_path, quota, message
):
    """The README's promise: the quota is checked before `pulumi up` builds the image and
    starts the pool. Only a targeted up of the account and what it needs has run."""
    world = World(tmp_path, quota=quota)
    code, text, (stack,) = run_main(world)
    assert code == 1 and results(text)["quota"] == "FAIL", text
    assert message in text
    ups = [call for call in stack.calls if call[0] == "up"]
    assert ups == [("up", "trainer/presets/acceptance-cpu.yaml", "targeted")], stack.calls
    assert results(text)["up"] == "NOT RUN"
    built = {urn.split("::")[2].rsplit("$", 1)[-1] for urn in world.created}
    assert "azure-native:batch:BatchAccount" in built
    never = ("batch:Pool", ":ImageBuild", "compute:VirtualMachine", "dynamic:Resource")
    assert not [typ for typ in built if typ.endswith(never)], built
    assert stack.calls[-2:] == [("destroy", ()), ("remove_stack", stack.name)]


def test_quotas_az_cannot_read_are_reported_not_failed(tmp_path):
    world = World(tmp_path)
    code, text, _ = run_main(world, host=good_host(answers={("az", "batch"): (1, "")}))
    assert code == 0 and "Batch core quota             not read" in text


def test_a_job_that_never_completes_fails_after_the_profiles_limit_and_is_destroyed(tmp_path):
    world = World(tmp_path)
    world.submit = lambda preset: (  # type: ignore[method-assign]
        setattr(world, "job_id", f"{world.stack_name}-first")
        or world.jobs.__setitem__(world.job_id, ["active"])
    )
    code, text, (stack,) = run_main(world)
    assert code == 1 and results(text)["job"] == "FAIL"
    assert f"job {world.job_id} is still active (task running) after 60 min" in text
    assert stack.calls[-2:] == [("destroy", ()), ("remove_stack", stack.name)]


def test_logs_are_read_once_the_role_and_ip_rule_apply(tmp_path):
    world = World(tmp_path, forbidden_first=2)
    code, text, _ = run_main(world)
    assert code == 0, text
    assert text.count("logs container answered 403; waiting for access") == 2


def test_the_gpu_profile_checks_nccl_over_infiniband_at_the_preflight_floor(tmp_path):
    world = World(tmp_path, profile="gpu", preflight_gbps=151.3)
    code, text, (stack,) = run_main(world)
    assert code == 0, text
    assert results(text)["preflight"] == results(text)["gpu-checks"] == "PASS"
    assert "preflight bus bandwidth 151.3 GB/s (floor 126.0 GB/s)" in text
    assert "2 nodes x 8 worker(s)" in text
    assert stack.config["gpu-cluster:vmSize"].value == "Standard_ND96asr_v4"
    assert stack.config["gpu-cluster:scaleMode"].value == "autoscale"
    slow = World(tmp_path / "slow", profile="gpu", preflight_gbps=21.0)
    code, text, _ = run_main(slow)
    assert code == 1 and "preflight bus bandwidth 21.0 GB/s < floor 126.0" in text


def test_the_summary_prints_the_time_and_the_cost_against_the_target(tmp_path):
    world = World(tmp_path)
    code, text, _ = run_main(world)
    assert code == 0
    elapsed = world.clock.now - 1000.0  # every second the fake operations and sleeps took
    hours = elapsed / 3600
    seconds = round(elapsed)
    over = ", over it" if seconds > 30 * 60 else ""
    assert f"Time: {seconds // 60} min {seconds % 60} s (target: under 30 min{over})" in text
    # A fixed pool of 2 nodes; `pulumi up` (which holds the ACR build) took what the fake
    # clock says, counted as the build's time.
    build = re.search(r"image build: ACR Task agent, 8 CPUs x (\d+) min", text)
    assert build is not None, text
    up_minutes = float(build.group(1))
    total = cost.total(run_cost(world.settings, hours, 2 * hours, up_minutes))
    assert abs(float(re.search(r"Estimated cost: \$([0-9.]+)", text).group(1)) - total) < 0.05
    assert "(target: under $2" in text
    assert "container registry (Premium), 1 day(s)" in text
    assert "not included: the ACR" not in text


def test_run_cost_charges_nodes_by_the_hour_and_the_registry_by_the_day():
    s = validated(acceptance_options("cpu"), acceptance_values("cpu"))
    items = dict(run_cost(s, 1.0, 2.0))
    assert items["pool: 2.00 node-hours of Standard_D2ds_v5"] == pytest.approx(0.226)
    assert items["NFS server Standard_D2s_v5, 1.00 h"] == pytest.approx(0.096)
    assert items["NAT gateway + public IP, 1.00 h"] == pytest.approx(0.05)
    assert items["container registry (Premium), 1 day(s)"] == pytest.approx(1.667)
    assert dict(run_cost(s, 25.0, 50.0))["container registry (Premium), 2 day(s)"] == 3.334


def test_run_cost_counts_the_acr_task_build_by_the_cpu_second():
    """The acr builder's agent has 8 CPUs (infra/image.py), billed USD 0.0001 per CPU-second:
    an hour of it is USD 2.88, more than the CPU profile's nodes, NFS and network together."""
    s = validated(acceptance_options("cpu"), acceptance_values("cpu"))
    items = dict(run_cost(s, 1.25, 2.5, build_minutes=60))
    assert items["image build: ACR Task agent, 8 CPUs x 60 min"] == pytest.approx(2.88)
    assert cost.total(list(items.items())) > 2.88 + 1.667


# ---------------------------------------------------------------- one-line failures
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"which": lambda name: None}, "the Pulumi CLI is not on PATH"),
        ({"answers": {("pulumi", "whoami"): (255, "")}}, "pulumi is not logged in"),
        (
            {"answers": {("pulumi", "whoami"): (0, '{"url": "azblob://state"}')}},
            "set PULUMI_CONFIG_PASSPHRASE (or _FILE), or pass --secrets-provider",
        ),
        ({"which": lambda name: None if name == "az" else name}, "(az) is not on PATH"),
        ({"answers": {("az", "account"): (1, "")}}, "az is not logged in: run az login"),
    ],
)
def test_missing_prerequisites_exit_1_with_one_line_before_anything_is_created(
    tmp_path, capsys, changes, message
):
    code, _, stacks = run_main(World(tmp_path), host=good_host(**changes))
    assert (code, stacks) == (1, [])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("error: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vm-size", "Standard_ND96asr_v4"], "--vm-size=Standard_ND96asr_v4: the cpu profile"),
        (["--location", "brazilsouth"], "location=brazilsouth: Standard_D2ds_v5 is not offered"),
        (["--budget-email", "nobody"], "budgetEmails=['nobody']"),
        (["--image-source-token-env", "NO_SUCH_VARIABLE"], "NO_SUCH_VARIABLE: not set"),
    ],
)
def test_bad_input_exits_2_with_one_line_before_anything_is_created(
    tmp_path, capsys, argv, message
):
    code, _, stacks = run_main(World(tmp_path), *argv, host=good_host(which=lambda name: None))
    # Input is checked before the prerequisites (here: no CLI at all) and before any stack.
    assert (code, stacks) == (2, [])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_checkout_the_acr_builder_cannot_build_is_refused_before_anything_is_created(
    tmp_path, capsys
):
    from infra.settings.checks import ConfigError

    def refuse() -> None:
        raise ConfigError("imageBuilder=acr: commit 1234 is not on the remote; push it first")

    code, _, stacks = run_main(World(tmp_path), host=good_host(check_source=refuse))
    assert (code, stacks) == (2, [])
    assert "push it first" in capsys.readouterr().err


def test_an_unknown_profile_is_argparses_one_line_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "dt_commands.acceptance", "--profile", "tpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--profile: invalid choice: 'tpu'" in result.stderr


# ---------------------------------------------------------------- the dry run
def test_the_dry_run_of_both_profiles_prints_the_stack_and_the_checks_without_azure():
    # Both at once (each evaluates the program under mocks); PATH without pulumi or az.
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    runs = {
        profile: subprocess.Popen(
            [sys.executable, "-m", "dt_commands.acceptance", "--profile", profile, "--dry-run"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for profile in ("cpu", "gpu")
    }
    out = {}
    for profile, process in runs.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        out[profile] = stdout
    cpu, gpu = out["cpu"], out["gpu"]
    for profile, text in out.items():
        assert "DRY RUN: nothing is created" in text
        assert re.search(rf"create the stack acceptance-{profile}-\d{{8}}-\d{{6}} ", text)
        assert f'gpu-cluster:acceptanceProfile: "{profile}"' in text
        assert "gpu-cluster:protectData: false" in text
        assert "+ azure-native:batch:Pool" in text and "+ pulumi-python:dynamic:Resource" in text
        assert "deployer-blob-reader" in text  # the check reads the logs as the deployer
        staged = text.split("First with --target", 1)[1].split("then without", 1)[0]
        assert "azure-native:batch:BatchAccount" in staged and "batch:Pool" not in staged
        numbered = re.findall(r"^\s+(\d+)\. ", text.split("Checks, in order:")[1], re.M)
        assert numbered == [str(n) for n in range(len(CHECKS) + 1)]
        assert "Then: the time taken and an estimated cost" in text
    assert '"vmSize": "Standard_D2ds_v5"' in cpu and cpu.count("SKIPPED for profile cpu") == 2
    assert CPU_SKIP_MESSAGE in cpu and "(target: under 30 min and under $2)" in cpu
    # The acr builder's hour of an 8-CPU agent is counted, not left out.
    for text in (cpu, gpu):
        assert re.search(r"image build: ACR Task agent, 8 CPUs x 60 min +\$ +2\.88", text), text
    assert '{"name": "acceptance", "value": "cpu"}' in cpu  # what the policy pack admits
    assert '"vmSize": "Standard_ND96asr_v4"' in gpu and "SKIPPED" not in gpu
    assert "2 nodes x 96 vCPUs = 192" in gpu  # the Batch quota the profile needs


# ---------------------------------------------------------------- the profiles' stack config
def test_the_cpu_profile_stack_is_a_small_container_pool_marked_for_the_policy_pack(
    acceptance_plan,
):
    pool = one(acceptance_plan, "azure-native:batch:Pool")
    assert pool.inputs["vmSize"] == "Standard_D2ds_v5"
    assert pool.inputs["interNodeCommunication"] == "Enabled"
    assert pool.inputs["scaleSettings"]["fixedScale"]["targetDedicatedNodes"] == 2
    config = pool.inputs["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert config["containerConfiguration"]["type"] == "DockerCompatible"
    assert config["imageReference"]["offer"] == "ubuntu-hpc"
    metadata = {m["name"]: m["value"] for m in pool.inputs["metadata"]}
    assert metadata == {"checkpointing": "true", "acceptance": "cpu"}
    vm = one(acceptance_plan, "azure-native:compute:VirtualMachine")
    assert vm.inputs["hardwareProfile"]["vmSize"] == "Standard_D2s_v5"
    assert [
        d.inputs["diskSizeGB"] for d in of_type(acceptance_plan, "azure-native:compute:Disk")
    ] == [32]
    assert not any(r.protect for r in acceptance_plan.resources)  # destroy removes everything
    reader = one(acceptance_plan, "azure-native:authorization:RoleAssignment", "-blob-reader")
    assert reader.inputs["roleDefinitionId"].endswith("2a2b9908-6ea1-4ae2-8e65-a410df84e7d1")
    job = one(acceptance_plan, "pulumi-python:dynamic:Resource")
    assert job.inputs["vm_size"] == "Standard_D2ds_v5" and job.inputs["node_count"] == 2
    account = one(acceptance_plan, "azure-native:storage:StorageAccount")
    rules = account.inputs["networkRuleSet"]["ipRules"]
    assert [r["iPAddressOrRange"] for r in rules] == [CLIENT_IP]
    from infra.batch import container_run_options

    assert container_run_options(job.inputs["vm_size"]) == CPU_CONTAINER_RUN_OPTIONS


def test_team_stacks_grant_the_deployer_no_blob_role(dev_plan):
    assert not [r for r in dev_plan.resources if r.name.endswith("-blob-reader")]
    pool = one(dev_plan, "azure-native:batch:Pool")
    assert "acceptance" not in {m["name"] for m in pool.inputs["metadata"]}


def test_config_map_sets_lists_element_by_element_with_their_path():
    values = acceptance_values("cpu")
    config = config_map(values)
    assert config["gpu-cluster:budgetEmails[0]"].value == "qa@example.com"
    assert "gpu-cluster:budgetEmails" not in config
    assert config["gpu-cluster:nodeCount"].value == "2"
    assert config["gpu-cluster:protectData"].value == "false"
    assert not any(value.secret for value in config.values())
    assert values["budget"] >= cost.total(
        cost.monthly_cost(validated(acceptance_options("cpu"), values).cost_inputs())
    )


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_presets_load_with_the_trainers_own_loader(profile):
    for preset in (PROFILES[profile].trainer_config, PROFILES[profile].long_trainer_config):
        request = parse(["--config", str(REPO / preset)])
        assert request.config.data == "synthetic"
        assert request.config.checkpoint_every > 0
    short = parse(["--config", str(REPO / PROFILES[profile].trainer_config)]).config
    assert short.max_steps == 20 and short.checkpoint_every == 10
    assert expected_checkpoints(PROFILES[profile].trainer_config) == [10, 20]
    assert stack_values(acceptance_options(profile))["trainerConfig"] == (
        PROFILES[profile].trainer_config
    )


def test_the_cpu_preset_trains_20_steps_and_logs_the_checkpoints_the_check_reads(tmp_path):
    output = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "trainer/presets/acceptance-cpu.yaml",
         "--backend", "local", "--output-dir", str(output), "--loader-workers", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    written = checks._CHECKPOINT_LINE.findall(result.stdout + result.stderr)
    assert [path.rsplit("/", 1)[1] for path, _ in written] == [
        "step-000000010.pt",
        "step-000000020.pt",
    ]
    # What the check expects is what the trainer writes: one rule (trainer.checkpoints.cadence).
    expected = expected_checkpoints("trainer/presets/acceptance-cpu.yaml")
    assert [path.rsplit("/", 1)[1] for path, _ in written] == [
        f"step-{step:09d}.pt" for step in expected
    ]
    assert all(path.startswith(f"{output}/checkpoints/") for path, _ in written)
    assert sorted(p.name for p in (output / "checkpoints").glob("*.pt")) == [
        "step-000000010.pt",
        "step-000000020.pt",
    ]


def test_a_job_whose_pool_cannot_get_nodes_fails_at_once_with_the_fix(tmp_path):
    """Quota reached: the task stays active and the pool says why (resizeErrors); the check
    stops at the first poll with the pool's line instead of waiting out the profile's hour."""
    world = World(tmp_path)
    real_get_job, real_get_task = world.get_job, world.get_task

    def get_job(job_id, **kwargs):
        job = real_get_job(job_id)
        job.pool_info = m.BatchPoolInfo(pool_id="ib-gpu")
        return job

    def get_task(job_id, task_id, **kwargs):
        task = real_get_task(job_id, task_id)
        task.state = "active"
        return task

    world.get_job, world.get_task = get_job, get_task  # type: ignore[method-assign]
    make_client = world.batch_client

    def batch_client(endpoint):
        client = make_client(endpoint)
        client.get_pool.return_value = m.BatchPool(
            id="ib-gpu",
            resize_errors=[
                m.ResizeError(code="AccountCoreQuotaReached", message="core quota reached")
            ],
        )
        client.list_nodes.return_value = []
        return client

    world.batch_client = batch_client  # type: ignore[method-assign]
    code, text, (stack,) = run_main(world)
    assert code == 1 and results(text)["job"] == "FAIL", text
    assert (
        "pool ib-gpu: resize error AccountCoreQuotaReached (core quota reached): the account's "
        "total dedicated core quota is used up" in text
    )
    assert stack.calls[-2:] == [("destroy", ()), ("remove_stack", stack.name)]


# ---------------------------------------------------------------- the staged up
def test_engine_urns_chain_every_ancestors_type_and_leave_the_root_stack_out():
    """The forms quoted from real engines: a top-level resource (pulumi/pulumi #3369) and a
    grandchild with its whole chain (#5869); the mocks' own URNs differ from both."""
    from dt_commands.mocks import Registration

    root = "urn:pulumi:dev::x::pulumi:pulumi:Stack::x-dev"
    nodes = {
        root: Registration("pulumi:pulumi:Stack", "x-dev", "", frozenset()),
        "m1": Registration("aws:ec2/subnet:Subnet", "main", root, frozenset()),
        "m2": Registration("foobar:aws:VPC", "vpc-prod", root, frozenset()),
        "m3": Registration("aws:ec2/vpc:Vpc", "vpc-prod-vpc", "m2", frozenset()),
        "m4": Registration(
            "aws:ec2/internetGateway:InternetGateway", "vpc-prod-vpc-ig", "m3", frozenset()
        ),
    }
    assert engine_urn(nodes, "m1", "dev") == (
        "urn:pulumi:dev::gpu-cluster::aws:ec2/subnet:Subnet::main"
    )
    assert engine_urn(nodes, "m4", "prod") == (
        "urn:pulumi:prod::gpu-cluster::foobar:aws:VPC$aws:ec2/vpc:Vpc"
        "$aws:ec2/internetGateway:InternetGateway::vpc-prod-vpc-ig"
    )


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_staged_up_targets_the_account_and_all_it_needs_and_not_the_pool_or_build(
    tmp_path, profile
):
    world = World(tmp_path, profile=profile)
    name = acceptance_options(profile).stack_name
    targets = account_targets(profile_plan(profile), name)
    graph = world.graph(name)
    assert set(targets) <= set(graph)
    for urn in targets:  # what the engine asks of a targeted update (pulumi/pulumi #5869)
        assert graph[urn] <= set(targets), (urn, graph[urn] - set(targets))
    types = {urn.split("::")[2].rsplit("$", 1)[-1] for urn in targets}
    assert {BATCH_ACCOUNT_TYPE, "azure-native:resources:ResourceGroup"} <= types
    never = ("batch:Pool", ":ImageBuild", "containerregistry:Task", "compute:VirtualMachine")
    assert not [t for t in types if t.endswith(never) or t == JOB_TYPE], types


def test_a_staged_up_missing_a_dependency_fails_as_the_engine_fails_it(tmp_path):
    """The fake engine is not lenient: the account alone, without its resource group and
    identity, is refused, and the run stops before the full up."""
    world = World(tmp_path)

    code, text, _ = run_main(
        world, targets=lambda urn: urn.split("::")[2].endswith(BATCH_ACCOUNT_TYPE)
    )
    assert code == 1 and results(text)["quota"] == "FAIL" and results(text)["up"] == "NOT RUN"
    assert "which was was not specified in --target list" in text
    assert not world.created


# ---------------------------------------------------------------- --image-ref
def test_an_image_ref_run_builds_nothing_and_its_cost_counts_no_acr_agent_or_registry(
    tmp_path,
):
    world = World(tmp_path, image_ref=REUSED_REF)

    def no_source_check() -> None:
        raise AssertionError("an --image-ref run clones and builds nothing")

    code, text, (stack,) = run_main(
        world, "--image-ref", REUSED_REF, host=good_host(world, check_source=no_source_check)
    )
    assert code == 0, text
    config = {key: value.value for key, value in stack.config.items()}
    assert config["gpu-cluster:imageRef"] == REUSED_REF
    assert config["gpu-cluster:imageRegistryId"] == REUSED_REGISTRY_ID  # from az acr show
    assert "gpu-cluster:imageSourceRepo" not in config
    built = {urn.split("::")[2].rsplit("$", 1)[-1] for urn in world.created}
    assert "azure-native:batch:Pool" in built
    assert not [t for t in built if t.endswith((":ImageBuild", "containerregistry:Registry"))]
    summary = text.split("Estimated cost:", 1)[1]
    assert "image build:" not in summary and "container registry" not in summary
    hours = (world.clock.now - 1000.0) / 3600
    total = cost.total(run_cost(world.settings, hours, 2 * hours, 60))
    assert abs(float(re.search(r"Estimated cost: \$([0-9.]+)", text).group(1)) - total) < 0.05


def test_the_dry_run_with_an_image_ref_plans_no_build_and_a_smaller_cost():
    out = io.StringIO()
    code = acceptance.main(
        ["--profile", "cpu", "--dry-run", "--image-ref", REUSED_REF],
        host=good_host(which=lambda name: None),  # no CLI: nothing is asked of Azure
        out=out,
    )
    text = out.getvalue()
    assert code == 0, text
    plan = text.split("then without, which declares:", 1)[1].split("Checks, in order:")[0]
    assert "+ azure-native:batch:Pool" in plan
    for absent in ("ImageBuild", "containerregistry:Task", "containerregistry:Registry"):
        assert absent not in plan
    assert "placeholder: a real run asks az acr show" in text
    costs = text.split("If the run takes 30 min", 1)[1]
    assert "image build" not in costs and "container registry" not in costs
    total = float(re.search(r"total +\$ +([0-9.]+)", costs).group(1))
    assert total < 0.5  # nodes, NFS and network for half an hour; no build, no registry


def test_run_cost_with_an_image_ref_leaves_out_the_build_and_the_registry():
    opts = acceptance_options("cpu", **reused(REUSED_REF))
    s = validated(opts, stack_values(opts))
    items = dict(run_cost(s, 1.25, 2.5, build_minutes=60))
    assert not [k for k in items if "build" in k or "registry" in k]
    assert cost.total(list(items.items())) == pytest.approx(
        2.5 * 0.113 + 1.25 * 0.096 + 1.25 * 0.05, abs=0.01
    )


@pytest.mark.parametrize(
    ("ref", "answers", "message"),
    [
        ("teamimages.azurecr.io/trainer:v3", {}, "which only a digest names"),
        ("ghcr.io/example/trainer@sha256:" + "3f" * 32, {}, "<name>.azurecr.io/<repository>@"),
        (
            REUSED_REF,
            {("az", "acr"): (3, "", "ERROR: (ResourceNotFound) registry not found")},
            "az acr show -n teamimages finds no registry",
        ),
        (
            REUSED_REF,
            {("az", "rest"): (0, json.dumps({"value": [CONTRIBUTOR]}))},
            "may not assign roles on registry teamimages",
        ),
    ],
)
def test_an_image_ref_the_nodes_could_not_pull_exits_2_before_anything_is_created(
    tmp_path, capsys, ref, answers, message
):
    code, _, stacks = run_main(World(tmp_path), "--image-ref", ref, host=good_host(answers=answers))
    assert (code, stacks) == (2, [])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_role_assignment_rights_are_read_as_arm_reads_actions_and_not_actions():
    owner = {"actions": ["*"], "notActions": []}
    acr_pull = {"actions": ["Microsoft.ContainerRegistry/registries/pull/read"], "notActions": []}
    uaa = {"actions": ["*/read", "Microsoft.Authorization/*"], "notActions": []}
    assert may_assign_roles([owner]) and may_assign_roles([uaa])
    assert may_assign_roles([CONTRIBUTOR, RBAC_ADMIN])
    assert not may_assign_roles([CONTRIBUTOR])  # its notActions take it back
    assert not may_assign_roles([acr_pull]) and not may_assign_roles([])
    shouting = {"actions": ["MICROSOFT.AUTHORIZATION/ROLEASSIGNMENTS/WRITE"], "notActions": []}
    assert may_assign_roles([shouting])
