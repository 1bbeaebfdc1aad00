"""The gpu-cluster program: config -> components in dependency order -> stack outputs."""

import pulumi
from pulumi_azure_native import authorization, resources

from infra import config, naming
from infra.cluster import GpuCluster, GpuClusterArgs
from infra.identity import Identities, IdentitiesArgs
from infra.monitoring import Monitoring, MonitoringArgs
from infra.network import Network, NetworkArgs
from infra.nfs import NfsArgs, NfsServer
from infra.registry import Registry, RegistryArgs
from infra.storage import CONTAINERS, Storage, StorageArgs

s = config.load()
stem, client = naming.prefix(s), authorization.get_client_config_output()
rg = resources.ResourceGroup(
    stem, resource_group_name=f"rg-{stem}", location=s.location, tags=naming.default_tags(s)
)
at = naming.Placement(rg.name, s.location, naming.default_tags(s))

net = Network(stem, NetworkArgs(at, s.vnet_cidr, s.compute_subnet_cidr, s.storage_subnet_cidr))
store = Storage(
    stem,
    StorageArgs(at, naming.global_name(s, "data"), [net.compute_subnet_id, net.storage_subnet_id]),
)
registry = Registry(
    stem,
    RegistryArgs(
        at, naming.global_name(s, "acr", 50), [net.nat_public_ip, *s.registry_allowed_ips]
    ),
)
ids = Identities(
    stem, IdentitiesArgs(at, client.subscription_id, registry.registry_id, store.account_id)
)
nfs = NfsServer(stem, NfsArgs.from_settings(at, s, net, naming.global_name(s, "nfs")))
cluster = GpuCluster(
    stem,
    GpuClusterArgs.from_settings(
        at,
        s,
        naming.global_name(s, "batch"),
        net.compute_subnet_id,
        ids.nodes.id,
        store.account_id,
        registry.login_server,
        nfs,
        client,
    ),
    opts=pulumi.ResourceOptions(depends_on=ids.assignments),
)
Monitoring(
    stem, MonitoringArgs(at, s.log_retention_days, cluster.account_id, store.account_id, nfs.vm_id)
)

for key, value in {
    "resource_group_name": rg.name,
    "storage_account_name": store.account_name,
    "storage_containers": list(CONTAINERS),
    "nfs_address": nfs.address,
    "nfs_export_path": nfs.export_path,
    "registry_login_server": registry.login_server,
    "batch_account_endpoint": cluster.account_endpoint,
    "pool_id": cluster.pool_id,
    "node_count": s.node_count,
    "vm_size": s.vm_size,
}.items():
    pulumi.export(key, value)
