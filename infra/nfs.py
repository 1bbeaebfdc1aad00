"""The shared file system every node mounts: an NFS server VM, or an Azure Files NFS 4.1 share.

``vm``: a Linux VM with no public IP (SSH key only) exporting a RAID0 of premium data disks to
the compute subnet only. The data disks are separate, protected resources: changing cloud-init
replaces the VM, never the data. ``azurefiles``: a premium FileStorage account with an NFS share,
reached through the VNet's service endpoint (NFS has no encryption in transit; network rules are
its protection, so the account denies everything but the VNet).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import compute, network, storage

from infra.cloud_init import MOUNT_POINT, ready_command, render_nfs_cloud_init
from infra.naming import Placement
from infra.settings.network import NetworkSettings
from infra.settings.nfs import NfsSettings

NFS_SHARE = "shared"
ADMIN_USER = "nfsadmin"
CUSTOM_DATA_PROPERTY = "osProfile.customData"


@dataclass(frozen=True)
class NfsArgs:
    """Where the file system goes besides its settings section: the storage subnet it serves
    from, the compute subnet it exports to (``network``'s ranges) and the Files account's name."""

    placement: Placement
    network: NetworkSettings
    storage_subnet_id: pulumi.Input[str]
    compute_subnet_id: pulumi.Input[str]
    files_account_name: str
    protect_data: bool = True


class NfsServer(pulumi.ComponentResource):
    source: pulumi.Output[str]
    """What nodes mount: ``host:/path``."""
    address: pulumi.Output[str]
    export_path: pulumi.Output[str]
    mount_options: str

    def __init__(
        self,
        name: str,
        nfs: NfsSettings,
        args: NfsArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpucluster:infra:NfsServer", name, None, opts)
        self.vm_id: pulumi.Output[str] | None = None
        if nfs.mode == "vm":
            self._server_vm(name, nfs, args)
        else:
            self._azure_files(name, nfs, args)
        self.source = pulumi.Output.concat(self.address, ":", self.export_path)
        self.register_outputs({"source": self.source})

    def _server_vm(self, name: str, nfs: NfsSettings, args: NfsArgs) -> None:
        disks = self._data_disks(name, nfs, args)
        nic = self._network_interface(name, args)
        vm = self._vm(name, nfs, args, nic, disks)
        ready = self._ready_gate(name, args, vm)
        self.vm_id = vm.id
        # From the NIC's and the extension's outputs: a data dependency the engine orders by.
        self.address = pulumi.Output.all(
            nic.ip_configurations[0].private_ip_address, ready.provisioning_state
        ).apply(lambda values: values[0] or args.network.nfs_server_ip)
        self.export_path = pulumi.Output.from_input(MOUNT_POINT)
        self.mount_options = "-o vers=4.1,hard,nconnect=8,rsize=1048576,wsize=1048576"

    def _data_disks(self, name: str, nfs: NfsSettings, args: NfsArgs) -> list[compute.Disk]:
        """The RAID0's premium disks: separate, protected resources that outlive the VM."""
        return [
            compute.Disk(
                f"{name}-data-{lun}",
                creation_data=compute.CreationDataArgs(
                    create_option=compute.DiskCreateOption.EMPTY
                ),
                disk_size_gb=nfs.disk_size_gb,
                sku=compute.DiskSkuArgs(name=compute.DiskStorageAccountTypes.PREMIUM_LRS),
                network_access_policy=compute.NetworkAccessPolicy.DENY_ALL,
                public_network_access=compute.PublicNetworkAccess.DISABLED,
                **args.placement.kwargs(),
                opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
            )
            for lun in range(nfs.disk_count)
        ]

    def _network_interface(self, name: str, args: NfsArgs) -> network.NetworkInterface:
        """The VM's only NIC: the fixed private address in the storage subnet, no public IP."""
        return network.NetworkInterface(
            f"{name}-nic",
            ip_configurations=[
                network.NetworkInterfaceIPConfigurationArgs(
                    name="primary",
                    subnet=network.SubnetArgs(id=args.storage_subnet_id),
                    private_ip_allocation_method=network.IPAllocationMethod.STATIC,
                    private_ip_address=args.network.nfs_server_ip,
                )
            ],
            enable_accelerated_networking=True,
            **args.placement.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _vm(
        self,
        name: str,
        nfs: NfsSettings,
        args: NfsArgs,
        nic: network.NetworkInterface,
        disks: list[compute.Disk],
    ) -> compute.VirtualMachine:
        return compute.VirtualMachine(
            f"{name}-vm",
            hardware_profile=compute.HardwareProfileArgs(vm_size=nfs.vm_size),
            network_profile=compute.NetworkProfileArgs(
                network_interfaces=[compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True)]
            ),
            storage_profile=_storage_profile(disks),
            os_profile=_os_profile(name, nfs, args.network),
            security_profile=compute.SecurityProfileArgs(
                encryption_at_host=False,
                security_type=compute.SecurityTypes.TRUSTED_LAUNCH,
                uefi_settings=compute.UefiSettingsArgs(
                    secure_boot_enabled=True, v_tpm_enabled=True
                ),
            ),
            **args.placement.kwargs(),
            # Azure refuses to change customData in place (PropertyChangeNotAllowed): a new
            # cloud-init replaces the VM. Its data disks are separate, protected resources
            # attached with deleteOption Detach, so they come back with their data.
            opts=pulumi.ResourceOptions(
                parent=self,
                delete_before_replace=True,
                replace_on_changes=[CUSTOM_DATA_PROPERTY],
            ),
        )

    def _ready_gate(
        self, name: str, args: NfsArgs, vm: compute.VirtualMachine
    ) -> compute.VirtualMachineExtension:
        """The VM exists before cloud-init has exported anything: this extension finishes only
        when the setup has (infra.cloud_init.render_ready_gate: cloud-init done, even degraded,
        the setup's marker, /data exported, the runs folder's mode), and the mount source
        depends on it, so no pool node mounts before the export is up."""
        return compute.VirtualMachineExtension(
            f"{name}-nfs-ready",
            vm_name=vm.name,
            vm_extension_name="wait-for-cloud-init",
            publisher="Microsoft.Azure.Extensions",
            type="CustomScript",
            type_handler_version="2.1",
            auto_upgrade_minor_version=True,
            protected_settings={"commandToExecute": ready_command()},
            **args.placement.kwargs(),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _azure_files(self, name: str, nfs: NfsSettings, args: NfsArgs) -> None:
        account = storage.StorageAccount(
            f"{name}-files",
            account_name=args.files_account_name,
            **args.placement.kwargs(),
            kind=storage.Kind.FILE_STORAGE,
            sku=storage.SkuArgs(name=storage.SkuName.PREMIUM_ZRS),
            # NFS 4.1 on Azure Files has no in-transit encryption; the network is the boundary.
            enable_https_traffic_only=False,
            minimum_tls_version=storage.MinimumTlsVersion.TLS1_2,
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            network_rule_set=storage.NetworkRuleSetArgs(
                default_action=storage.DefaultAction.DENY,
                bypass=storage.Bypass.NONE,
                virtual_network_rules=[
                    storage.VirtualNetworkRuleArgs(
                        virtual_network_resource_id=args.compute_subnet_id
                    )
                ],
            ),
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
        )
        share = storage.FileShare(
            f"{name}-share",
            account_name=account.name,
            resource_group_name=args.placement.resource_group_name,
            share_name=NFS_SHARE,
            enabled_protocols=storage.EnabledProtocols.NFS,
            # A new share's root is root-owned and tasks run as a non-admin user: the pool's
            # start task (root on the node) creates the world-writable runs folder, which root
            # squashing would forbid. Only the compute subnet reaches the share.
            root_squash=storage.RootSquashType.NO_ROOT_SQUASH,
            share_quota=nfs.share_quota_gb,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect_data),
        )
        self.address = pulumi.Output.concat(account.name, ".file.core.windows.net")
        # From the share's output, so nodes never mount before the share exists.
        self.export_path = pulumi.Output.concat("/", account.name, "/", share.name)
        self.mount_options = "-o vers=4,minorversion=1,sec=sys,nconnect=4"


def _storage_profile(disks: list[compute.Disk]) -> compute.StorageProfileArgs:
    """Ubuntu 24.04 on a premium OS disk that goes with the VM; the data disks attached."""
    return compute.StorageProfileArgs(
        image_reference=compute.ImageReferenceArgs(
            publisher="Canonical", offer="ubuntu-24_04-lts", sku="server", version="latest"
        ),
        os_disk=compute.OSDiskArgs(
            create_option=compute.DiskCreateOptionTypes.FROM_IMAGE,
            managed_disk=compute.ManagedDiskParametersArgs(
                storage_account_type=compute.StorageAccountTypes.PREMIUM_LRS
            ),
            delete_option=compute.DiskDeleteOptionTypes.DELETE,
        ),
        data_disks=[
            compute.DataDiskArgs(
                lun=lun,
                create_option=compute.DiskCreateOptionTypes.ATTACH,
                managed_disk=compute.ManagedDiskParametersArgs(id=disk.id),
                caching=compute.CachingTypes.NONE,
                # Detach, never delete, when the VM goes.
                delete_option=compute.DiskDeleteOptionTypes.DETACH,
            )
            for lun, disk in enumerate(disks)
        ],
    )


def _os_profile(
    name: str, nfs: NfsSettings, network_settings: NetworkSettings
) -> compute.OSProfileArgs:
    """SSH key only, and the cloud-init that builds the RAID0 and exports it."""
    user_data = render_nfs_cloud_init(nfs.disk_count, network_settings.compute_subnet_cidr)
    return compute.OSProfileArgs(
        computer_name=f"{name}-nfs"[:15],
        admin_username=ADMIN_USER,
        custom_data=base64.b64encode(user_data.encode()).decode(),
        linux_configuration=compute.LinuxConfigurationArgs(
            disable_password_authentication=True,
            ssh=compute.SshConfigurationArgs(
                public_keys=[
                    compute.SshPublicKeyArgs(
                        key_data=nfs.ssh_public_key,
                        path=f"/home/{ADMIN_USER}/.ssh/authorized_keys",
                    )
                ]
            ),
            provision_vm_agent=True,
        ),
    )
