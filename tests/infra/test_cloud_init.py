"""The NFS server's user data, checked by the real ``cloud-init schema`` validator."""

import shutil
import subprocess

import yaml

from infra.cloud_init import render_nfs_cloud_init


def test_user_data_passes_cloud_init_schema(tmp_path):
    cloud_init = shutil.which("cloud-init")
    assert cloud_init, "cloud-init is installed by scripts/setup_env.sh"
    path = tmp_path / "user-data.yaml"
    path.write_text(render_nfs_cloud_init(4, "10.20.0.0/20"))
    result = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout + result.stderr
    # The validator really checks: a misspelt type is refused.
    path.write_text(
        render_nfs_cloud_init(4, "10.20.0.0/20").replace(
            "package_update: true", "package_update: sometimes"
        )
    )
    refused = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0


def test_existing_data_is_never_reformatted():
    document = yaml.safe_load(render_nfs_cloud_init(3, "10.20.0.0/20"))
    script = next(
        f["content"]
        for f in document["write_files"]
        if f["path"] == "/usr/local/sbin/setup-nfs-data"
    )
    # mkfs only runs inside the branch taken when no filesystem carries the label.
    guard = script.index("if ! blkid -L nfsdata")
    assert all(script.index(m) > guard for m in ("mkfs.ext4 -L nfsdata", "mdadm --create"))
    assert script.index("mdadm --assemble --scan") < guard
    assert script.count("/dev/disk/azure/data/by-lun/") == 3


def test_export_is_limited_to_the_compute_subnet():
    document = yaml.safe_load(render_nfs_cloud_init(1, "10.20.0.0/20"))
    exports = next(f["content"] for f in document["write_files"] if f["path"] == "/etc/exports")
    assert exports == "/data 10.20.0.0/20(rw,sync,no_subtree_check,root_squash)\n"
    assert {"nfs-kernel-server", "mdadm"} <= set(document["packages"])
