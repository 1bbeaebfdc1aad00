"""The acceptance run's time and cost: an estimate at the list prices of ``infra.prices`` for the
dry run's assumed length, and for a real run's measured one in its summary."""

from __future__ import annotations

import math

from dt_commands.acceptance.profiles import Profile
from infra import cost, prices
from infra.image import BUILD_AGENT_CPUS
from infra.settings.stack import StackSettings

# What the dry run assumes the ACR Task build takes (not a measurement; Horovod's NCCL build
# dominates it); a real run counts its `pulumi up`, which holds the build, as an upper bound.
ASSUMED_BUILD_MINUTES = 60


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


def target_text(profile: Profile) -> str:
    if profile.target is None:
        return ""
    minutes, usd = profile.target
    return f" (target: under {minutes} min and under ${usd:.0f})"


def pool_node_hours(s: StackSettings, stack_hours: float, busy_hours: float) -> float:
    """Fixed pools run for the stack's whole life; autoscaled ones roughly while jobs are
    queued or running, plus the idle time before they scale to zero."""
    if s.cluster.scale_mode == "fixed":
        return s.cluster.node_count * stack_hours
    return s.cluster.node_count * min(stack_hours, busy_hours + s.cluster.idle_minutes / 60)


def summary_lines(
    profile: Profile, s: StackSettings, hours: float, node_hours: float, build_minutes: float
) -> list[str]:
    """The time a run took and what it cost, against the profile's target."""
    minutes = hours * 60
    total = cost.total(run_cost(s, hours, node_hours, build_minutes))
    time_note = cost_note = ""
    if profile.target is not None:
        target_minutes, target_usd = profile.target
        time_note = f" (target: under {target_minutes} min" + (
            ", over it)" if minutes > target_minutes else ")"
        )
        cost_note = f" (target: under ${target_usd:.0f}" + (
            ", over it)" if total > target_usd else ")"
        )
    seconds = round(hours * 3600)
    return [
        f"Time: {seconds // 60} min {seconds % 60} s{time_note}",
        f"Estimated cost: ${total:.2f}{cost_note}",
        *cost_lines(s, hours, node_hours, build_minutes),
    ]


def assumed_cost_lines(profile: Profile, s: StackSettings) -> list[str]:
    """The dry run's estimate: the cost of a run of the profile's assumed length."""
    minutes = profile.reused_minutes if s.image.ref else profile.assumed_minutes
    hours = minutes / 60
    lines = cost_lines(s, hours, pool_node_hours(s, hours, hours), ASSUMED_BUILD_MINUTES)
    if s.image.ref:
        lines.append(
            f"    (--image-ref: no build and no registry of the stack's; the run assumed at "
            f"{minutes} min; {s.image.ref.split('@')[0]}'s registry bills its owner)"
        )
    elif s.image.builder == "acr":
        lines.append(
            f"    (the image build assumed at {ASSUMED_BUILD_MINUTES} min of the ACR Task agent, "
            "its usual length with the Horovod build; a real run counts the whole `pulumi up` "
            "as build time, an upper bound)"
        )
    if s.cluster.scale_mode != "fixed":
        lines.append("    (autoscaled pool: counted for the whole run, an upper bound)")
    return lines
