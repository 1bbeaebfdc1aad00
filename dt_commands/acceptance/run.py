"""An acceptance run's steps through Pulumi's Automation API: the stack's config, the targeted
``pulumi up`` of the Batch account (then its quota check), the full ``pulumi up``, the checks in
``CHECKS`` order, the replacement a ``pulumi destroy --target`` must stop, and the teardown and
summary, which run however the checks ended."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TextIO

from dt_commands.acceptance import checks
from dt_commands.acceptance.context import POLL_SECONDS, Context, Result, batch_state, error_line
from dt_commands.acceptance.cost import pool_node_hours, summary_lines
from dt_commands.acceptance.errors import CheckFailed
from dt_commands.acceptance.host import run_command
from dt_commands.acceptance.options import Options, config_map, validated
from dt_commands.acceptance.profiles import CHECKS, POLICY_PACK
from infra.naming import PROJECT, prefix
from infra.settings.values import REPO

JOB_TYPE = "pulumi-python:dynamic:Resource"  # TrainingJob's type token (infra/job.py)
RUNNING_WAIT_SECONDS = 1800.0


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
        self.ctx = Context(
            opts, values, validated(opts, values), stack, batch_client, logs_container, out,
            run or run_command, clock, sleep, targets or [],
        )  # fmt: skip

    def run(self) -> int:
        ctx = self.ctx
        started = ctx.clock()
        results: list[Result] = []
        failed = False
        steps = [check for check in CHECKS if check.key != "destroy"]
        try:
            for check in steps:
                result = _step(ctx, check)
                results.append(result)
                if result.status == "FAIL":
                    failed = True
                    break
        except KeyboardInterrupt:
            failed = True
            ctx.say("interrupted: cleaning up")
        finally:
            done = {r.check.key for r in results}
            results += [Result(c, "NOT RUN") for c in steps if c.key not in done]
            results.append(teardown(ctx, failed))
        hours = (ctx.clock() - started) / 3600
        busy = (ctx.clock() - ctx.busy_since) / 3600 if ctx.busy_since is not None else 0.0
        summary(ctx, results, hours, pool_node_hours(ctx.settings, hours, busy))
        return 1 if any(r.status == "FAIL" for r in results) else 0


def _step(ctx: Context, check: Any) -> Result:
    """One check, run (or skipped for the profile, with why); any failure is one line."""
    reason = check.skipped.get(ctx.opts.profile.name)
    if reason:
        ctx.say(f"{check.title}: SKIPPED ({reason})")
        return Result(check, "SKIPPED", reason)
    ctx.say(f"{check.title}: {check.what}")
    try:
        detail = STEPS[check.key](ctx)
    except CheckFailed as err:
        return Result(check, "FAIL", str(err))
    except Exception as err:  # a Pulumi or Azure error: one line, then clean up
        return Result(check, "FAIL", f"{type(err).__name__}: {error_line(err)}")
    ctx.say(f"{check.title}: PASS ({detail})")
    return Result(check, "PASS", detail)


def configure(ctx: Context) -> None:
    ctx.stack.set_all_config(config_map(ctx.values), path=True)
    if ctx.opts.image_source_token:
        from pulumi.automation import ConfigValue

        ctx.stack.set_config(
            f"{PROJECT}:imageSourceToken",
            ConfigValue(value=ctx.opts.image_source_token, secret=True),
        )


def quota(ctx: Context) -> str:
    """A Batch account in Batch-service mode has its own core quotas, per VM family and in
    total, set when the account is created; for new accounts they may be reduced, in some
    regions to zero, and a pool beyond them never gets its nodes (articles/batch/
    batch-quota-limit.md). No subscription quota tells them before the account exists
    (the Compute vCPU quotas count only for UserSubscription accounts, same article), so a
    targeted `pulumi up` creates the account first; read them with the ARM rights that
    created it."""
    configure(ctx)
    if not ctx.targets:
        raise CheckFailed("no targets for the Batch account's staged `pulumi up`")
    ctx.say(f"pulumi up --target: the Batch account and {len(ctx.targets) - 1} resources")
    ctx.stack.up(
        target=ctx.targets,
        on_output=ctx.pulumi_line,
        on_error=ctx.pulumi_line,
        policy_packs=[str(POLICY_PACK)],
    )
    return checks.batch_quota(ctx)


def up(ctx: Context) -> str:
    started = ctx.clock()
    result = ctx.stack.up(
        on_output=ctx.pulumi_line,
        on_error=ctx.pulumi_line,
        policy_packs=[str(POLICY_PACK)],
    )
    ctx.busy_since = ctx.clock()
    ctx.build_minutes = (ctx.busy_since - started) / 60
    changes = getattr(getattr(result, "summary", None), "resource_changes", None) or {}
    return f"{changes.get('create', 0)} resources created"


def terminate(ctx: Context) -> str:
    from pulumi.automation import ConfigValue

    from infra.batch import TASK_ID
    from trainer.common.azure_sdk import ResourceNotFoundError

    first = ctx.outputs["job_id"]
    long_run = ctx.opts.profile.long_trainer_config
    ctx.stack.set_config(f"{PROJECT}:trainerConfig", ConfigValue(value=long_run))
    ctx.stack.up(
        on_output=ctx.pulumi_line,
        on_error=ctx.pulumi_line,
        policy_packs=[str(POLICY_PACK)],
    )
    job_id = ctx.stack.outputs()["job_id"].value
    if job_id == first:
        raise CheckFailed(f"a new trainerConfig did not replace job {first}")
    deadline = ctx.clock() + RUNNING_WAIT_SECONDS
    while (task := checks.task_state(ctx, job_id)) != "running":
        if task == "completed" or ctx.clock() > deadline:
            raise CheckFailed(f"job {job_id}'s task is {task}, never seen running")
        ctx.sleep(POLL_SECONDS)
    # `pulumi destroy --target <urn>` deletes that resource alone (nothing depends on the
    # job), through TrainingJobProvider.delete: terminate, delete, wait for Batch's 404. The
    # Batch account must still exist to see the result, hence before the full destroy.
    ctx.say(f"job {job_id} is running: `pulumi destroy --target` on it")
    ctx.stack.destroy(target=[job_urn(ctx)], on_output=ctx.pulumi_line, on_error=ctx.pulumi_line)
    try:
        state = batch_state(ctx.client.get_job(job_id).state)
    except ResourceNotFoundError:
        return f"job {job_id} (task {TASK_ID} running) terminated and deleted (404)"
    if state not in ("terminating", "completed", "deleting"):
        raise CheckFailed(f"job {job_id} is still {state} after `pulumi destroy`")
    return f"job {job_id} is {state} after `pulumi destroy`"


def job_urn(ctx: Context) -> str:
    """The TrainingJob's URN from the stack's state (``<stem>-job``, infra/stack.py)."""
    name = f"{prefix(team=ctx.settings.team, stack=ctx.settings.stack)}-job"
    resources = (ctx.stack.export_stack().deployment or {}).get("resources", [])
    urns = [
        r["urn"]
        for r in resources
        if r.get("type") == JOB_TYPE and str(r.get("urn", "")).endswith(f"::{name}")
    ]
    if len(urns) != 1:
        raise CheckFailed(f"found {len(urns)} TrainingJob resources named {name} in the state")
    return urns[0]


def teardown(ctx: Context, failed: bool) -> Result:
    check = next(c for c in CHECKS if c.key == "destroy")
    name = ctx.opts.stack_name
    if failed and ctx.opts.keep_on_failure:
        ctx.say(
            f"a check failed and --keep-on-failure is set: stack {name} is left as it is; "
            f"remove it with `pulumi destroy --stack {name} --yes && pulumi stack rm "
            f"{name} --yes`"
        )
        return Result(check, "NOT RUN", "--keep-on-failure")
    ctx.say(f"pulumi destroy of {name}, then stack rm")
    try:
        ctx.stack.destroy(on_output=ctx.pulumi_line, on_error=ctx.pulumi_line)
        ctx.stack.workspace.remove_stack(name)
    except Exception as err:
        group = f"rg-{prefix(team=ctx.settings.team, stack=ctx.settings.stack)}"
        return Result(
            check,
            "FAIL",
            f"{error_line(err)}; finish by hand: `pulumi destroy --stack {name} --yes`, "
            f"`pulumi stack rm {name} --yes` (or `az group delete -n {group}`)",
        )
    return Result(check, "PASS", f"stack {name} destroyed and removed")


def summary(ctx: Context, results: list[Result], hours: float, node_hours: float) -> None:
    w = ctx.out.write
    w(f"\nAcceptance results (profile {ctx.opts.profile.name}, stack {ctx.opts.stack_name}):\n")
    for r in results:
        w(f"  {r.status:<8} {r.check.title:<28} {r.detail}\n")
    lines = summary_lines(ctx.opts.profile, ctx.settings, hours, node_hours, ctx.build_minutes)
    w("\n".join(lines) + "\n")
    ctx.out.flush()


# The steps, by check key (in CHECKS order).
STEPS: dict[str, Callable[[Context], str]] = {
    "quota": quota,
    "up": up,
    "outputs": checks.outputs,
    "job": checks.job,
    "nodes": checks.nodes,
    "logs": checks.logs,
    "workers": checks.workers,
    "checkpoint": checks.checkpoint,
    "gpu-checks": checks.gpu_checks,
    "preflight": checks.preflight,
    "terminate": terminate,
}


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
    from infra import credentials  # the process's one credential, as the job resource's
    from trainer.common.azure_sdk import ContainerClient

    return ContainerClient(account_url, "logs", credential=credentials.credential())
