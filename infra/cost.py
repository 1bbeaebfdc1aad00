"""The offline monthly cost estimate, shared by the plan and the budget policy.

It works on ``CostInputs``, which the settings build for the plan (``StackSettings.cost_inputs``)
and the policy pack builds from the declared resources, so both apply exactly the same arithmetic
to the same price table. A table of facts: it imports no setting, component or tool.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra import prices

DEFAULT_BUSY_HOURS = 160


@dataclass(frozen=True)
class CostInputs:
    gpu_size: str
    nodes: int
    always_on: bool
    # Spot nodes bill at a variable rate that is at most pay-as-you-go, evicted nodes included
    # while powered on (azure-ai-docs PR #791, 2026-07-21, read 2026-11-28): priced at that cap.
    spot: bool = False
    nfs_vm_size: str | None = None
    nfs_disk_gb: int = 0
    files_share_gb: int = 0
    # False when the stack runs an image from another registry (imageRef): it declares none.
    own_registry: bool = True
    # An AzureML workspace beside the pool (azuremlWorkspace): its endpoint and DNS zones.
    azureml_workspace: bool = False


def monthly_cost(c: CostInputs, busy_hours: int = DEFAULT_BUSY_HOURS) -> list[tuple[str, float]]:
    """(item, USD per month). Autoscaled GPUs are priced for ``busy_hours``; sizes missing from
    the price table are listed at 0 with a note rather than guessed."""
    hours = prices.HOURS_PER_MONTH if c.always_on else busy_hours
    gpu = prices.VM_PER_HOUR.get(c.gpu_size)
    items = []
    if gpu is None:
        items.append((f"{c.gpu_size}: not in the price table", 0.0))
    else:
        kind = " Spot (at most; the rate varies)" if c.spot else ""
        items.append((f"{c.nodes} x {c.gpu_size}{kind}, {hours} h", gpu * c.nodes * hours))
    if c.nfs_vm_size is not None:
        vm = prices.VM_PER_HOUR.get(c.nfs_vm_size)
        items.append(
            (
                f"NFS server {c.nfs_vm_size}" + ("" if vm else ": not in the price table"),
                (vm or 0.0) * prices.HOURS_PER_MONTH,
            )
        )
    if c.nfs_disk_gb:
        items.append(
            (
                f"NFS premium disks {c.nfs_disk_gb} GiB",
                c.nfs_disk_gb * prices.PREMIUM_SSD_PER_GB_MONTH,
            )
        )
    if c.files_share_gb:
        items.append(
            (
                f"Azure Files premium NFS {c.files_share_gb} GiB",
                c.files_share_gb * prices.PREMIUM_FILES_PER_GB_MONTH,
            )
        )
    network_hourly = prices.NAT_GATEWAY_PER_HOUR + prices.PUBLIC_IP_PER_HOUR
    items.append(("NAT gateway + public IP", network_hourly * prices.HOURS_PER_MONTH))
    if c.own_registry:
        items.append(("Container registry (Premium)", prices.ACR_PREMIUM_PER_MONTH))
    if c.azureml_workspace:
        endpoint = prices.PRIVATE_ENDPOINT_PER_HOUR * prices.HOURS_PER_MONTH
        zones = 2 * prices.PRIVATE_DNS_ZONE_PER_MONTH
        items.append(("AzureML workspace: private endpoint + 2 DNS zones", endpoint + zones))
    return items


def total(items: list[tuple[str, float]]) -> float:
    return sum(cost for _, cost in items)
