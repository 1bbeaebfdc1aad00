"""Monitoring: a Log Analytics workspace and diagnostic settings that send it the Batch
account's logs and metrics, the storage account's blob logs and the NFS VM's metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import monitor, operationalinsights

from infra.naming import Placement


@dataclass(frozen=True)
class MonitoringArgs:
    placement: Placement
    retention_days: int
    batch_account_id: pulumi.Input[str]
    storage_account_id: pulumi.Input[str]
    nfs_vm_id: pulumi.Input[str] | None = field(default=None)


class Monitoring(pulumi.ComponentResource):
    workspace_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:Monitoring", name, None, opts)
        workspace = operationalinsights.Workspace(
            f"{name}-logs",
            resource_group_name=args.placement.resource_group_name,
            location=args.placement.location,
            sku=operationalinsights.WorkspaceSkuArgs(
                name=operationalinsights.WorkspaceSkuNameEnum.PER_GB2018
            ),
            retention_in_days=args.retention_days,
            tags=args.placement.tag_map(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        all_logs = [monitor.DiagnosticsLogSettingsArgs(category_group="allLogs", enabled=True)]
        all_metrics = [monitor.DiagnosticsMetricSettingsArgs(category="AllMetrics", enabled=True)]
        targets: list[tuple[str, pulumi.Input[str], bool]] = [
            ("batch", args.batch_account_id, True),
            ("blob", pulumi.Output.concat(args.storage_account_id, "/blobServices/default"), True),
        ]
        if args.nfs_vm_id is not None:
            targets.append(("nfs-vm", args.nfs_vm_id, False))  # VMs expose metrics only
        self.settings = [
            monitor.DiagnosticSetting(
                f"{name}-{label}-diagnostics",
                name=f"to-{name}-logs",
                resource_uri=resource_id,
                workspace_id=workspace.id,
                logs=all_logs if has_logs else None,
                metrics=all_metrics,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for label, resource_id, has_logs in targets
        ]
        self.workspace_id = workspace.id
        self.register_outputs({"workspace_id": self.workspace_id})
