"""The shared file system's section: an NFS server VM (its size, disks and admin key) or an Azure
Files NFS share (its quota), each field checked here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.settings.checks import ConfigError, in_range
from infra.settings.schema import setting

NFS_MODES = ("vm", "azurefiles")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]{40,}( .*)?$"
)


@dataclass(frozen=True, kw_only=True)
class NfsSettings:
    """The shared file system: an NFS server VM or an Azure Files NFS share."""

    mode: str = setting(
        "nfsMode",
        "vm",
        "vm (a Linux NFS server with RAID0 premium disks) or azurefiles (premium NFS 4.1 share).",
    )
    vm_size: str = setting("nfsVmSize", "Standard_D16s_v5", "VM size of the NFS server.")
    disk_count: int = setting(
        "nfsDiskCount", 4, "Premium data disks striped (RAID0) on the NFS server."
    )
    disk_size_gb: int = setting("nfsDiskSizeGb", 1024, "Size of each NFS data disk in GiB.")
    share_quota_gb: int = setting(
        "nfsShareQuotaGb", 1024, "Quota of the Azure Files NFS share in GiB (nfsMode azurefiles)."
    )
    ssh_public_key: str = setting(
        "sshPublicKey",
        "",
        "OpenSSH public key for the NFS server's admin user (no passwords are set).",
    )

    def check(self) -> None:
        if self.mode not in NFS_MODES:
            raise ConfigError(f"nfsMode={self.mode!r}: use {' or '.join(NFS_MODES)}")
        in_range("nfsDiskCount", self.disk_count, 1, 16)
        in_range("nfsDiskSizeGb", self.disk_size_gb, 32, 32767)
        in_range("nfsShareQuotaGb", self.share_quota_gb, 100, 102400)
        if self.mode == "vm" and not _SSH_KEY.match(self.ssh_public_key):
            raise ConfigError(
                f"sshPublicKey={self.ssh_public_key[:20]!r}: nfsMode vm needs an OpenSSH public "
                'key; run pulumi config set sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"'
            )
