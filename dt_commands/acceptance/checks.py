"""The acceptance run's checks of what the stack did, each a function of the run's ``Context``
that returns what it saw or raises ``CheckFailed`` with what was expected and what was seen."""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

from dt_commands.acceptance.context import POLL_SECONDS, Context, batch_state
from dt_commands.acceptance.errors import CheckFailed
from dt_commands.acceptance.options import expected_checkpoints
from infra.naming import global_name, prefix
from infra.sizes import size_of
from trainer.common.errors import one_line

AUTH_WAIT_SECONDS = 600.0  # new role assignments and IP rules take minutes to apply
LOG_WAIT_SECONDS = 300.0  # output files are uploaded as the task completes
# The log lines the checks read: trainer/checkpoints/checkpointer.py, trainer/launch/records.py and
# its report.
_CHECKPOINT_LINE = re.compile(r"checkpoint written: (\S+) \(uid (\d+)\)")
_WORKERS_LINE = re.compile(r"node (\d+)/(\d+): starting (\d+) worker\(s\)")
_PREFLIGHT_LINE = re.compile(r"preflight: allreduce bus bandwidth ([0-9.]+) GB/s")
_NODE_SECTION = re.compile(r"^===== node (\d+)/(\d+) ", re.MULTILINE)


def batch_quota(ctx: Context) -> str:
    """The Batch account's dedicated cores, in total and for the size's family, against what
    the pool needs (see ``run.quota`` for why they are read after a targeted up)."""
    s = ctx.settings
    # The names infra/stack.py gives them (naming is deterministic per stack).
    account = global_name(team=s.team, stack=s.stack, role="batch")
    group = f"rg-{prefix(team=s.team, stack=s.stack)}"
    need = s.cluster.node_count * s.cluster.gpu.vcpus
    family_query = f"[?name=='{s.cluster.vm_size}'].family | [0]"
    quotas = (
        "{total: dedicatedCoreQuota, families: dedicatedCoreQuotaPerVmFamily, "
        "enforced: dedicatedCoreQuotaPerVmFamilyEnforced}"
    )
    skus = ctx.shell(
        [
            *("az", "vm", "list-skus", "-l", s.location, "--size", s.cluster.vm_size),
            *("--query", family_query, "-o", "tsv"),
        ]
    )
    shown = ctx.shell(
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


def outputs(ctx: Context) -> str:
    ctx.outputs = {key: out.value for key, out in ctx.stack.outputs().items()}
    o, s = ctx.outputs, ctx.settings
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
            o["image_ref"] == (ctx.opts.image_ref or o["image_ref"]),
            f"image_ref={o['image_ref']}, not --image-ref {ctx.opts.image_ref}",
        ),
        (
            o["job_log_url"].endswith(f"/logs/{o['job_id']}/")
            and urllib.parse.urlsplit(o["job_log_url"]).hostname
            == f"{o['storage_account_name']}.blob.core.windows.net",
            f"job_log_url={o['job_log_url']} is not the job's folder in the logs container",
        ),
        (
            o["job_checkpoint_path"].startswith(f"shared/runs/{ctx.opts.stack_name}/"),
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
    ctx.client = ctx.batch_client(o["batch_account_endpoint"])
    return f"job {o['job_id']} ({o['job_state']}), image {o['image_ref'].split('@')[1][:19]}"


def job(ctx: Context) -> str:
    job_id = ctx.outputs["job_id"]
    started = ctx.clock()
    deadline = started + ctx.opts.profile.job_minutes * 60
    seen = ""
    while True:
        job = ctx.client.get_job(job_id)
        state = batch_state(job.state)
        task = task_state(ctx, job_id)
        if f"{state}/{task}" != seen:
            seen = f"{state}/{task}"
            ctx.say(f"job {job_id}: {state}, task {task}")
        if task == "active":
            # Nodes that will not come (quota, capacity, failed start tasks) show on the
            # pool only (infra/pool_health.py): stop now, not after the profile's limit.
            problems = pool_lines(ctx.client, job, "the acceptance check destroys the stack")
            if problems:
                raise CheckFailed(problems[0])
        if state == "completed":
            minutes = (ctx.clock() - started) / 60
            return f"completed after {minutes:.0f} min"
        if ctx.clock() > deadline:
            raise CheckFailed(
                f"job {job_id} is still {state} (task {task}) after "
                f"{ctx.opts.profile.job_minutes} min: look at the job and the pool's "
                f"nodes in the portal ({ctx.outputs['job_portal_url']})"
            )
        ctx.sleep(POLL_SECONDS)


def task_state(ctx: Context, job_id: str) -> str:
    """The task's state; "not added yet" while the job has none."""
    from infra.batch import TASK_ID
    from trainer.common.azure_sdk import ResourceNotFoundError

    try:
        return batch_state(ctx.client.get_task(job_id, TASK_ID).state)
    except ResourceNotFoundError:
        return "not added yet"


def nodes(ctx: Context) -> str:
    from infra.batch import TASK_ID

    job_id = ctx.outputs["job_id"]
    task = ctx.client.get_task(job_id, TASK_ID)
    info = task.execution_info
    code = None if info is None else info.exit_code
    if code != 0:
        failure = getattr(getattr(info, "failure_info", None), "message", None)
        raise CheckFailed(
            f"primary task exit code {code}"
            + (f" ({failure})" if failure else "")
            + f": its stdout and stderr go to {ctx.outputs['job_log_url']}"
        )
    nodes = {getattr(task.node_info, "node_id", None)}
    # List Subtasks returns the subtasks only, not the primary (ID 0)
    # (articles/batch/batch-mpi.md, "Obtain information about subtasks").
    subtasks = list(ctx.client.list_subtasks(job_id, TASK_ID))
    for sub in subtasks:
        if batch_state(sub.state) != "completed" or sub.exit_code != 0:
            raise CheckFailed(
                f"subtask {sub.id} on node {getattr(sub.node_info, 'node_id', '?')}: "
                f"{batch_state(sub.state)}, exit code {sub.exit_code}"
            )
        nodes.add(getattr(sub.node_info, "node_id", None))
    nodes.discard(None)
    expected = ctx.settings.cluster.node_count
    if len(subtasks) != expected - 1 or len(nodes) != expected:
        raise CheckFailed(
            f"{len(subtasks)} subtasks on {len(nodes)} distinct nodes; a job of "
            f"{expected} nodes has {expected - 1} subtasks besides the primary"
        )
    return f"primary and {len(subtasks)} subtask(s) exited 0 on {len(nodes)} nodes"


def logs(ctx: Context) -> str:
    from trainer.common.azure_sdk import HttpResponseError, ResourceNotFoundError

    url = urllib.parse.urlsplit(ctx.outputs["job_log_url"])
    account_url = f"{url.scheme}://{url.netloc}"
    folder = url.path.split("/logs/", 1)[1]
    container = ctx.logs_container(account_url)
    auth_deadline = ctx.clock() + AUTH_WAIT_SECONDS
    log_deadline = ctx.clock() + LOG_WAIT_SECONDS
    while True:
        try:
            names = sorted(b.name for b in container.list_blobs(name_starts_with=folder))
        except HttpResponseError as err:
            # 403 until the deployer's Blob Data Reader role and this IP's rule apply.
            if err.status_code != 403 or ctx.clock() > auth_deadline:
                raise CheckFailed(
                    f"cannot list {account_url}/logs/{folder} ({err.status_code}): the "
                    "deployer needs Storage Blob Data Reader on the account (acceptance "
                    "stacks grant it) and this machine's IP in storageAllowedIps"
                ) from None
            ctx.say(f"logs container answered {err.status_code}; waiting for access")
            ctx.sleep(POLL_SECONDS)
            continue
        wanted = {f"{folder}stdout.txt", f"{folder}stderr.txt"}
        if wanted <= set(names):
            break
        if ctx.clock() > log_deadline:
            raise CheckFailed(
                f"{account_url}/logs/{folder} holds {names or 'nothing'}, not stdout.txt "
                "and stderr.txt: the task's output files were not uploaded"
            )
        ctx.sleep(POLL_SECONDS)
    try:
        data = container.download_blob(f"{folder}stdout.txt").readall()
    except ResourceNotFoundError:
        raise CheckFailed(f"{folder}stdout.txt disappeared from the logs container") from None
    ctx.stdout_text = data.decode("utf-8", errors="replace")
    return f"{', '.join(n.rsplit('/', 1)[1] for n in names)} ({len(data):,} bytes of stdout)"


def workers(ctx: Context) -> str:
    text, count = ctx.stdout_text, ctx.settings.cluster.node_count
    sections = {int(m.group(1)) for m in _NODE_SECTION.finditer(text)}
    if sections != set(range(1, count + 1)):
        raise CheckFailed(
            f"the report has logs of nodes {sorted(sections)}, not of all {count} nodes"
        )
    per_node = max(1, size_of(ctx.settings.cluster.vm_size).gpus)
    started = {int(m.group(1)): int(m.group(3)) for m in _WORKERS_LINE.finditer(text)}
    wrong = {node: n for node, n in started.items() if n != per_node}
    if set(started) != set(range(1, count + 1)) or wrong:
        raise CheckFailed(
            f"workers started per node {started}: expected {per_node} on each of {count}"
        )
    if not re.search(r"^===== attempt \S+: every node finished$", text, re.MULTILINE):
        raise CheckFailed("the report does not end with 'every node finished'")
    return f"{count} nodes x {per_node} worker(s), every node finished"


def checkpoint(ctx: Context) -> str:
    run_folder = f"/{ctx.outputs['job_checkpoint_path']}/checkpoints/"
    written = {
        path: int(uid)
        for path, uid in _CHECKPOINT_LINE.findall(ctx.stdout_text)
        if run_folder in path
    }
    wanted = [f"step-{step:09d}.pt" for step in expected_checkpoints(ctx.values["trainerConfig"])]
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


def gpu_checks(ctx: Context) -> str:
    size = size_of(ctx.settings.cluster.vm_size)
    return (
        f"{ctx.settings.cluster.node_count} nodes ran the task, so each passed its start "
        "task: "
        f"{size.gpus} GPUs, driver, {size.ib_ports} active InfiniBand ports"
    )


def preflight(ctx: Context) -> str:
    from trainer.launch.node_sizes import preflight_floor

    floor = preflight_floor(ctx.settings.cluster.vm_size)
    found = [float(v) for v in _PREFLIGHT_LINE.findall(ctx.stdout_text)]
    if not found:
        raise CheckFailed("no 'preflight: allreduce bus bandwidth' line in the job's stdout")
    if min(found) < floor:
        raise CheckFailed(f"preflight bus bandwidth {min(found):.1f} GB/s < floor {floor}")
    return f"preflight bus bandwidth {min(found):.1f} GB/s (floor {floor} GB/s)"


def pool_lines(client: Any, job: Any, cancel_hint: str) -> list[str]:
    from dt_commands.jobs.status import pool_lines as lines

    return lines(client, job, cancel_hint)
