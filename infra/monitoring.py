"""Monitoring: a Log Analytics workspace and diagnostic settings that send it the Batch
account's logs and metrics, the storage account's blob logs, the NFS VM's metrics and the AzureML
workspace's logs and metrics (when the stack declares one)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import monitor, operationalinsights

from infra.naming import Placement

# Storage services (blobServices/default) offer the metric categories Transaction and Capacity,
# not AllMetrics: asking for AllMetrics there is a 400 (Azure/azure-powershell #6520;
# articles/storage/blobs/monitor-blob-storage-reference.md). Capacity is an hourly account
# figure; Transaction is what a training job's reads and writes show up in.
BLOB_METRIC_CATEGORY = "Transaction"


@dataclass(frozen=True)
class MonitoringArgs:
    placement: Placement
    retention_days: int
    # None on the AzureML backend (no Batch account, no NFS server: the workspace instead).
    batch_account_id: pulumi.Input[str] | None
    storage_account_id: pulumi.Input[str]
    nfs_vm_id: pulumi.Input[str] | None = field(default=None)
    azureml_workspace_id: pulumi.Input[str] | None = field(default=None)


class Monitoring(pulumi.ComponentResource):
    workspace_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Monitoring", name, None, opts)
        workspace = operationalinsights.Workspace(
            f"{name}-logs",
            **args.placement.kwargs(),
            sku=operationalinsights.WorkspaceSkuArgs(
                name=operationalinsights.WorkspaceSkuNameEnum.PER_GB2018
            ),
            retention_in_days=args.retention_days,
            opts=pulumi.ResourceOptions(parent=self),
        )
        all_logs = [monitor.DiagnosticsLogSettingsArgs(category_group="allLogs", enabled=True)]
        targets: list[tuple[str, pulumi.Input[str], bool, str]] = [
            (
                "blob",
                pulumi.Output.concat(args.storage_account_id, "/blobServices/default"),
                True,
                BLOB_METRIC_CATEGORY,
            ),
        ]
        if args.batch_account_id is not None:
            targets.insert(0, ("batch", args.batch_account_id, True, "AllMetrics"))
        if args.nfs_vm_id is not None:
            targets.append(("nfs-vm", args.nfs_vm_id, False, "AllMetrics"))  # metrics only
        if args.azureml_workspace_id is not None:
            # Its compute clusters' and runs' events (AmlComputeClusterEvent, ...).
            targets.append(("azureml", args.azureml_workspace_id, True, "AllMetrics"))
        self.settings = [
            monitor.DiagnosticSetting(
                f"{name}-{label}-diagnostics",
                name=f"to-{name}-logs",
                resource_uri=resource_id,
                workspace_id=workspace.id,
                logs=all_logs if has_logs else None,
                metrics=[monitor.DiagnosticsMetricSettingsArgs(category=metrics, enabled=True)],
                opts=pulumi.ResourceOptions(parent=self),
            )
            for label, resource_id, has_logs, metrics in targets
        ]
        self.workspace_id = workspace.id
        self.register_outputs({"workspace_id": self.workspace_id})
