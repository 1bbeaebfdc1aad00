"""Whole-program tests: both stack files evaluated under mocks, then the security and
correctness policies checked on what the program declared. ``one()`` fails when a resource is
missing, so no check can pass on an empty recording."""

import base64
import ipaddress
import uuid

from dt_commands.mocks import DEPLOYER_OBJECT_ID, SUBSCRIPTION_ID
from dt_commands.plan import evaluate
from infra.identity import (
    ACR_PULL,
    ACR_PUSH,
    NODE_BLOB_ROLES,
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    STORAGE_BLOB_DATA_READER,
)
from infra.naming import REQUIRED_TAGS, TAGGABLE
from infra.settings.budget import current_month
from infra.storage import CONTAINERS, OPERATOR_CONTAINERS
from tests.support.stacks import of_type, one, stack_values


def test_every_taggable_resource_carries_team_stack_cost_center_project(plan):
    taggable = [r for r in plan.resources if r.typ in TAGGABLE]
    assert len(taggable) >= 10
    for resource in taggable:
        tags = resource.inputs.get("tags", {})
        assert set(REQUIRED_TAGS) <= set(tags), resource.name
        assert tags.get("team") == plan.settings.team, resource.name
        assert tags.get("stack") == plan.settings.stack, resource.name
        assert tags.get("cost-center") == plan.settings.cost_center, resource.name
        assert tags.get("project") == "gpu-cluster", resource.name


def test_stack_outputs(plan):
    assert set(plan.outputs) == {
        "resource_group_name",
        "storage_account_name",
        "storage_containers",
        "nfs_address",
        "nfs_export_path",
        "registry_login_server",
        "batch_account_endpoint",
        "pool_id",
        "node_count",
        "vm_size",
        "image_ref",
        "image_digest",
        "job_id",
        "job_state",
        "job_portal_url",
        "job_log_url",
        "job_checkpoint_path",
        "jobs",
    }
    assert plan.outputs["storage_containers"] == [
        "datasets",
        "checkpoints",
        "logs",
        "outputs",
        "code",
    ]
    assert plan.outputs["vm_size"] == plan.settings.cluster.vm_size
    assert plan.outputs["node_count"] == plan.settings.cluster.node_count


def test_every_job_output_names_its_progress_for_image_and_language_models(dev_plan):
    # The refresh fills whichever rate the run logs (infra.job): images or, for a language
    # model, tokens per second.
    for job in dev_plan.outputs["jobs"].values():
        assert {"step", "images_per_sec", "tokens_per_sec", "outputs_url"} <= set(job), job


def test_a_jobs_outputs_are_the_ones_declared_once(dev_plan):
    """``infra.job_outputs.JOB_OUTPUTS`` names a job's outputs once: every output of the resource is
    one of them, the program exports exactly those for each job (the single job's ``job_*`` at
    the top level too), and the commands read back the same names."""
    from dt_commands import stack_outputs
    from infra.job import TrainingJob
    from infra.job_outputs import JOB_OUTPUTS, OUTPUT_KEYS

    declared = {name for name, kind in TrainingJob.__annotations__.items() if "Output" in kind}
    assert set(OUTPUT_KEYS) == declared
    assert {v for v in JOB_OUTPUTS.values() if v is not None} == declared
    for job in dev_plan.outputs["jobs"].values():
        assert set(job) == set(JOB_OUTPUTS)
    assert stack_outputs.JOB_OUTPUTS is JOB_OUTPUTS


def test_only_the_nat_gateway_has_a_public_ip(plan):
    ips = of_type(plan, "azure-native:network:PublicIPAddress")
    assert [ip.name for ip in ips] == [f"{plan.outputs['resource_group_name'][3:]}-nat-ip"]
    for nic in of_type(plan, "azure-native:network:NetworkInterface"):
        assert all("publicIPAddress" not in c for c in nic.inputs["ipConfigurations"])


def test_pool_nodes_have_no_public_ip_and_simplified_communication(plan):
    pool = one(plan, "azure-native:batch:Pool").inputs
    network = pool["networkConfiguration"]
    assert network["publicIPAddressConfiguration"]["provision"] == "NoPublicIPAddresses"
    assert pool["targetNodeCommunicationMode"] == "Simplified"
    assert network["subnetId"].endswith("-compute")


def test_pool_is_an_infiniband_multi_instance_pool(plan):
    pool = one(plan, "azure-native:batch:Pool").inputs
    s = plan.settings
    assert pool["vmSize"] == s.cluster.vm_size
    assert pool["interNodeCommunication"] == "Enabled"
    assert pool["taskSlotsPerNode"] == 1
    vm = pool["deploymentConfiguration"]["virtualMachineConfiguration"]
    assert vm["imageReference"]["publisher"] == "microsoft-dsvm"
    assert vm["imageReference"]["offer"] == "ubuntu-hpc"
    assert vm["nodeAgentSkuId"] == s.cluster.gpu.image.node_agent_sku_id
    assert vm["osDisk"] == {"diskSizeGB": s.cluster.os_disk_size_gb}
    registry = vm["containerConfiguration"]["containerRegistries"][0]
    assert registry["registryServer"] == plan.outputs["registry_login_server"]
    assert registry["identityReference"]["resourceId"].endswith("-nodes")
    assert "password" not in registry and "userName" not in registry
    assert pool["identity"]["type"] == "UserAssigned"
    start = pool["startTask"]
    assert start["waitForSuccess"] is True
    assert f"-eq {s.cluster.gpu.gpus} ]" in start["commandLine"]
    assert "/sys/class/infiniband" in start["commandLine"]


def test_pool_mounts_the_nfs_share(plan):
    mount = one(plan, "azure-native:batch:Pool").inputs["mountConfiguration"][0]
    nfs = mount["nfsMountConfiguration"]
    assert nfs["source"] == f"{plan.outputs['nfs_address']}:{plan.outputs['nfs_export_path']}"
    assert nfs["relativeMountPath"] == "shared"


def test_scale_settings_follow_the_stack(dev_plan, prod_plan):
    dev = one(dev_plan, "azure-native:batch:Pool").inputs["scaleSettings"]
    assert "$TargetDedicatedNodes = $busy ? 2 : 0;" in dev["autoScale"]["formula"]
    assert "TimeInterval_Minute * 10" in dev["autoScale"]["formula"]
    prod = one(prod_plan, "azure-native:batch:Pool").inputs["scaleSettings"]
    assert prod["fixedScale"]["targetDedicatedNodes"] == 4
    # A dedicated pool leaves the low-priority (Spot) fields unset, as before Spot came back:
    # an upgrade changes none of its inputs.
    assert "targetLowPriorityNodes" not in prod["fixedScale"]
    assert "TargetLowPriorityNodes" not in dev["autoScale"]["formula"]


def test_a_spot_pool_asks_for_its_nodes_through_the_low_priority_fields_only():
    """Batch-managed accounts turn low-priority requests into Spot nodes since March 2026
    (Azure/Batch #196, read 2026-11-28); all of the pool's nodes are Spot, none dedicated."""
    dev = evaluate("dev", {**stack_values("dev"), "gpu-cluster:spot": True})
    formula = one(dev, "azure-native:batch:Pool").inputs["scaleSettings"]["autoScale"]["formula"]
    assert "$TargetLowPriorityNodes = $busy ? 2 : 0;" in formula.splitlines()
    assert "$TargetDedicatedNodes = 0;" in formula.splitlines()
    prod = evaluate("vision-prod", {**stack_values("vision-prod"), "gpu-cluster:spot": True})
    fixed = one(prod, "azure-native:batch:Pool").inputs["scaleSettings"]["fixedScale"]
    assert fixed["targetLowPriorityNodes"] == 4 and fixed["targetDedicatedNodes"] == 0


def test_batch_account_uses_entra_auth_and_identity_auto_storage(plan):
    account = one(plan, "azure-native:batch:BatchAccount").inputs
    assert account["allowedAuthenticationModes"] == ["AAD"]
    assert account["poolAllocationMode"] == "BatchService"
    assert account["autoStorage"]["authenticationMode"] == "BatchAccountManagedIdentity"


def test_data_storage_is_identity_only_encrypted_and_private(plan):
    account = one(plan, "azure-native:storage:StorageAccount", "-account").inputs
    assert account["enableHttpsTrafficOnly"] is True
    assert account["minimumTlsVersion"] == "TLS1_2"
    assert account["allowBlobPublicAccess"] is False
    assert account["allowSharedKeyAccess"] is False
    rules = account["networkRuleSet"]
    assert rules["defaultAction"] == "Deny"
    assert len(rules["virtualNetworkRules"]) == 2
    blob = one(plan, "azure-native:storage:BlobServiceProperties").inputs
    assert blob["isVersioningEnabled"] is True
    assert blob["deleteRetentionPolicy"] == {"enabled": True, "days": 7}
    containers = of_type(plan, "azure-native:storage:BlobContainer")
    assert sorted(c.inputs["containerName"] for c in containers) == [
        "checkpoints",
        "code",
        "datasets",
        "logs",
        "outputs",
    ]
    assert all(c.inputs["publicAccess"] == "None" for c in containers)


def test_the_data_account_holds_no_file_share_nodes_could_not_mount(plan):
    """An SMB share on an account with shared keys off mounts only with a directory service's
    Kerberos identity (storage-files-active-directory-overview, read 2026-11-28), which Batch
    nodes do not have; the `results` share was declared, never mounted and never written."""
    data_shares = [
        share
        for share in of_type(plan, "azure-native:storage:FileShare")
        if share.inputs.get("enabledProtocols") != "NFS"
    ]
    assert data_shares == []
    assert of_type(plan, "azure-native:storage:FileServiceProperties") == []


def test_registry_has_admin_and_anonymous_pull_off_and_denies_by_default(plan):
    registry = one(plan, "azure-native:containerregistry:Registry").inputs
    assert registry["adminUserEnabled"] is False
    assert registry["anonymousPullEnabled"] is False
    assert registry["networkRuleSet"]["defaultAction"] == "Deny"
    allowed = [r["iPAddressOrRange"] for r in registry["networkRuleSet"]["ipRules"]]
    assert allowed[0] == "203.0.113.10"  # the NAT gateway: the nodes' egress address


def test_no_nsg_rule_allows_inbound_from_the_internet(plan):
    for nsg in of_type(plan, "azure-native:network:NetworkSecurityGroup"):
        for rule in nsg.inputs["securityRules"]:
            if rule["direction"] == "Inbound" and rule["access"] == "Allow":
                source = rule["sourceAddressPrefix"]
                assert source not in ("*", "Internet", "0.0.0.0/0"), (nsg.name, rule["name"])
                assert ipaddress.ip_network(source).is_private


def test_nfs_ports_are_open_to_the_compute_subnet_only(plan):
    nsg = one(plan, "azure-native:network:NetworkSecurityGroup", "-storage-nsg").inputs
    allows = [r for r in nsg["securityRules"] if r["access"] == "Allow"]
    assert len(allows) == 1
    assert allows[0]["sourceAddressPrefix"] == plan.settings.network.compute_subnet_cidr
    assert sorted(allows[0]["destinationPortRanges"]) == ["111", "2049"]
    deny = next(r for r in nsg["securityRules"] if r["name"] == "deny-nfs-from-elsewhere")
    assert deny["priority"] > allows[0]["priority"]


def test_subnets_have_no_default_outbound_and_use_the_nat_gateway(plan):
    subnets = of_type(plan, "azure-native:network:Subnet")
    assert len(subnets) == 2
    for subnet in subnets:
        assert subnet.inputs["defaultOutboundAccess"] is False
        assert subnet.inputs["natGateway"]["id"].endswith("-nat")
        assert subnet.inputs["serviceEndpoints"] == [{"service": "Microsoft.Storage"}]


def test_nfs_vm_is_private_key_only_and_exports_to_compute_only(dev_plan):
    vm = one(dev_plan, "azure-native:compute:VirtualMachine").inputs
    linux = vm["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert "adminPassword" not in vm["osProfile"]
    assert linux["ssh"]["publicKeys"][0]["keyData"] == dev_plan.settings.nfs.ssh_public_key
    user_data = base64.b64decode(vm["osProfile"]["customData"]).decode()
    export_line = f"/data {dev_plan.settings.network.compute_subnet_cidr}(rw,sync,no_subtree_check"
    assert export_line in user_data
    nic = one(dev_plan, "azure-native:network:NetworkInterface").inputs
    assert nic["ipConfigurations"][0]["privateIPAddress"] == "10.20.16.4"
    assert nic["ipConfigurations"][0]["subnet"]["id"].endswith("-storage")


def test_nfs_data_disks_are_separate_protected_and_survive_the_vm(dev_plan):
    disks = of_type(dev_plan, "azure-native:compute:Disk")
    assert len(disks) == dev_plan.settings.nfs.disk_count == 2
    assert all(d.protect for d in disks)
    assert all(d.inputs["networkAccessPolicy"] == "DenyAll" for d in disks)
    attached = one(dev_plan, "azure-native:compute:VirtualMachine").inputs["storageProfile"]
    assert [d["createOption"] for d in attached["dataDisks"]] == ["Attach", "Attach"]
    assert {d["deleteOption"] for d in attached["dataDisks"]} == {"Detach"}


def test_data_holding_resources_are_protected(plan):
    for resource in of_type(plan, "azure-native:storage:StorageAccount"):
        assert resource.protect, resource.name
    compute = [
        r
        for r in plan.resources
        if r.typ in ("azure-native:batch:Pool", "azure-native:compute:VirtualMachine")
    ]
    assert compute and not any(r.protect for r in compute)  # destroy removes compute


def test_azure_files_mode_uses_a_premium_nfs_share_and_no_vm(prod_plan):
    assert not of_type(prod_plan, "azure-native:compute:VirtualMachine")
    files = one(prod_plan, "azure-native:storage:StorageAccount", "-files").inputs
    assert files["kind"] == "FileStorage"
    assert files["sku"]["name"].startswith("Premium_")
    assert files["networkRuleSet"]["defaultAction"] == "Deny"
    share = one(prod_plan, "azure-native:storage:FileShare", "-share").inputs
    assert share["enabledProtocols"] == "NFS"
    # Not squashed: the start task (root on the node) makes the task users' runs folder.
    assert share["rootSquash"] == "NoRootSquash"
    account = files["accountName"]
    assert prod_plan.outputs["nfs_address"] == f"{account}.file.core.windows.net"
    assert prod_plan.outputs["nfs_export_path"] == f"/{account}/shared"


def test_least_privilege_role_assignments_with_deterministic_names(plan, dev_plan):
    assignments = {
        r.name.rsplit("-", 1)[-1]: r.inputs
        for r in of_type(plan, "azure-native:authorization:RoleAssignment")
    }
    assert assignments["acrpull"]["roleDefinitionId"].endswith(ACR_PULL)
    assert assignments["acrpull"]["scope"].endswith(plan.outputs["registry_login_server"][:-11])
    assert assignments["acrpush"]["roleDefinitionId"].endswith(ACR_PUSH)
    for reader in ("datasets", "code"):
        assert assignments[reader]["roleDefinitionId"].endswith(STORAGE_BLOB_DATA_READER)
    for writer in ("logs", "outputs"):
        assert assignments[writer]["roleDefinitionId"].endswith(STORAGE_BLOB_DATA_CONTRIBUTOR)
    (deployer,) = [
        r.inputs
        for r in of_type(plan, "azure-native:authorization:RoleAssignment")
        if r.name.endswith("-deployer-submitter")
    ]
    assert deployer["principalId"] == DEPLOYER_OBJECT_ID
    for inputs in assignments.values():
        uuid.UUID(inputs["roleAssignmentName"])
        assert "Contributor" not in inputs["roleDefinitionId"]


def test_role_assignment_names_are_stable_across_runs(dev_plan):
    again = evaluate("dev", stack_values("dev"))

    def names(plan):
        return sorted(
            r.inputs["roleAssignmentName"]
            for r in of_type(plan, "azure-native:authorization:RoleAssignment")
        )

    assert names(again) == names(dev_plan)
    # AcrPull and one Blob role per container for the nodes, AcrPush for the build task, Job
    # Submitter and a Reader on each operator container for the deployer and the team's group.
    operators = 2 * (1 + len(OPERATOR_CONTAINERS))
    assert len(set(names(dev_plan))) == 2 + len(CONTAINERS) + operators


def test_no_node_blob_grant_reaches_beyond_its_container(plan):
    """Least privilege: every Blob role of the nodes is scoped to one container of the stack's
    account, each container has exactly one, and none writes the code snapshots."""
    account = one(plan, "azure-native:storage:StorageAccount", "-account")
    account_id = (
        f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/mock/providers/storage/"
        f"{account.inputs['accountName']}"
    )
    grants = {}
    for assignment in of_type(plan, "azure-native:authorization:RoleAssignment"):
        if "-nodes-blob" not in assignment.name:
            continue
        scope = assignment.inputs["scope"]
        prefix = f"{account_id}/blobServices/default/containers/"
        assert scope.startswith(prefix), f"{assignment.name}: not one container: {scope}"
        container = scope.removeprefix(prefix)
        assert container in CONTAINERS and container not in grants, assignment.name
        grants[container] = assignment.inputs["roleDefinitionId"].rsplit("/", 1)[-1]
    assert grants == NODE_BLOB_ROLES and set(grants) == set(CONTAINERS)
    assert grants["code"] == STORAGE_BLOB_DATA_READER


def test_diagnostics_reach_the_log_analytics_workspace(dev_plan, prod_plan):
    dev_targets = {
        r.name.split("-")[-2] for r in of_type(dev_plan, "azure-native:monitor:DiagnosticSetting")
    }
    assert dev_targets == {"batch", "blob", "vm"}
    assert len(of_type(prod_plan, "azure-native:monitor:DiagnosticSetting")) == 2
    workspace = one(prod_plan, "azure-native:operationalinsights:Workspace").inputs
    assert workspace["retentionInDays"] == 90


def test_budget_alerts_the_stack_emails(plan):
    budget = one(plan, "azure-native:consumption:Budget").inputs
    assert budget["amount"] == plan.settings.budget.amount
    assert budget["timeGrain"] == "Monthly"
    start = plan.settings.budget.start_month or current_month()  # empty: the month it is made
    assert budget["timePeriod"]["startDate"] == f"{start}-01"
    assert budget["scope"].endswith(plan.outputs["resource_group_name"])
    for notification in budget["notifications"].values():
        assert notification["contactEmails"] == list(plan.settings.budget.emails)
    assert {n["thresholdType"] for n in budget["notifications"].values()} == {
        "Actual",
        "Forecasted",
    }


def test_pool_records_the_checkpointing_setting(plan):
    metadata = one(plan, "azure-native:batch:Pool").inputs["metadata"]
    assert metadata == [{"name": "checkpointing", "value": "true"}]


def test_opting_out_of_data_protection_unprotects_data(dev_plan):
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:protectData": False})
    data = of_type(plan, "azure-native:storage:StorageAccount") + of_type(
        plan, "azure-native:compute:Disk"
    )
    assert data and not any(r.protect for r in data)
    assert all(r.protect for r in of_type(dev_plan, "azure-native:compute:Disk"))
