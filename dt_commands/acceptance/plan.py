"""What an acceptance run would do, from the program as the offline plan evaluates it: the dry
run (the stack's config, both ``pulumi up`` runs, the checks in order, the estimate) and the
first, targeted up's resources (the Batch account and what it needs)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TextIO

from dt_commands.acceptance.cost import assumed_cost_lines, target_text
from dt_commands.acceptance.options import Options, expected_checkpoints, validated
from dt_commands.acceptance.profiles import CHECKS, POLICY_PACK
from infra.naming import PROJECT
from infra.settings.values import REPO

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


def plan_targets(opts: Options, values: dict[str, Any]) -> list[str]:
    """The staged up's targets, from the program as the offline plan evaluates it."""
    from dt_commands.plan import evaluate

    return account_targets(evaluate(opts.stack_name, values), opts.stack_name)


def describe(opts: Options, values: dict[str, Any], out: TextIO) -> None:
    """What a real run would create and check, in order (the offline plan under mocks)."""
    from dt_commands.plan import evaluate, render

    settings = validated(opts, values)
    plan = evaluate(opts.stack_name, values)
    out.write(_config_text(opts, values))
    out.write(_steps_text(opts, account_targets(plan, opts.stack_name), render(plan, 160)))
    out.write(_job_text(opts))
    out.write("".join(f"{line}\n" for line in assumed_cost_lines(opts.profile, settings)))


def _config_text(opts: Options, values: dict[str, Any]) -> str:
    profile = opts.profile
    lines = [
        f"Acceptance check, profile {profile.name}: {profile.what}.",
        "DRY RUN: nothing is created; no Azure, Pulumi CLI or network was used.",
        "",
        f"It would create the stack {opts.stack_name} of project {PROJECT} (this directory) "
        "with the Automation API, set this config (pulumi config set --path):",
    ]
    for key, value in values.items():
        note = opts.placeholders.get(key)
        lines.append(f"  {PROJECT}:{key}: {json.dumps(value)}" + (f"  # {note}" if note else ""))
    if opts.client_ip is None:
        lists = "storageAllowedIps" + (
            " and registryAllowedIps" if opts.image_builder == "docker" else ""
        )
        lines.append(
            f"  (a real run adds this machine's public IP to {lists}, looked up when it "
            "starts, or --client-ip)"
        )
    return "\n".join(lines) + "\n"


def _steps_text(opts: Options, staged: list[str], declared: str) -> str:
    """The two ``pulumi up`` runs (the targeted one's resources, then all the program
    declares) and the checks in order, each skipped one with why."""
    lines = [
        f"and run `pulumi up --policy-pack {POLICY_PACK.relative_to(REPO)}` twice. First with "
        f"--target for the Batch account and the {len(staged) - 1} resources it needs, so its "
        "core quota is read before the image build, the NFS server and the pool exist:",
        *(f"  {urn.split('::')[2].rsplit('$', 1)[-1]}  {urn.rsplit('::', 1)[1]}" for urn in staged),
        "then without, which declares:",
        "",
        declared,
        "",
        "Checks, in order:",
        f"   0. {'prerequisites':<28} the Pulumi CLI on PATH and logged in to a state backend "
        "(and a secrets provider or passphrase for it); `az account show` succeeds",
    ]
    name = opts.profile.name
    for number, check in enumerate(CHECKS, start=1):
        reason = check.skipped.get(name)
        status = f"SKIPPED for profile {name}: {reason}" if reason else check.what
        lines.append(f"  {number:>2}. {check.title:<28} {status}")
    return "\n".join(lines) + "\n"


def _job_text(opts: Options) -> str:
    profile = opts.profile
    steps = ", ".join(str(step) for step in expected_checkpoints(profile.trainer_config))
    return (
        f"\nThe job: {profile.trainer_config} on {profile.node_count} x {opts.vm_size} "
        f"(checkpoints at steps {steps}); the run `pulumi destroy` must stop: "
        f"{profile.long_trainer_config}.\n"
        f"Then: the time taken and an estimated cost{target_text(profile)}. If the run takes "
        + (
            f"{profile.reused_minutes} min (an assumption, not a measurement; no build):\n"
            if opts.image_ref
            else f"{profile.assumed_minutes} min (an assumption, not a measurement; the image "
            "build on ACR is most of it):\n"
        )
    )
