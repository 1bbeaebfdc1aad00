"""Every policy with a compliant and a violating resource, called directly (PolicyPack() would
start a server and block), then both stacks' full plans checked against every policy."""

import copy

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.naming import TAGGABLE
from policy.rules import ALL_POLICIES

OPTS = PolicyResourceOptions(
    protect=False,
    ignore_changes=[],
    delete_before_replace=None,
    aliases=[],
    custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
    additional_secret_outputs=[],
    parent=None,
)
POLICIES = {p.name: p for p in ALL_POLICIES}
# The rules that read the whole stack; every other one reads one resource.
STACK_POLICIES = {p.name for p in ALL_POLICIES if isinstance(p, StackValidationPolicy)}
TAGS = {"project": "gpu-cluster", "team": "vision", "stack": "vision-prod", "cost-center": "cc"}


def check(policy_name, resource_type, props):
    violations = []
    args = ResourceValidationArgs(
        resource_type=resource_type,
        props=props,
        urn=f"urn:{resource_type}",
        name="r",
        opts=OPTS,
        provider=None,
    )
    POLICIES[policy_name].validate(args, lambda message, urn=None: violations.append(message))
    return violations


def policy_resources(resources):
    """(type, props) pairs as the pack's stack rules receive them."""
    return [
        PolicyResource(
            resource_type=typ,
            props=props,
            urn=f"urn:{i}",
            name=f"r{i}",
            opts=OPTS,
            provider=None,
            parent=None,
            dependencies=[],
            property_dependencies={},
        )
        for i, (typ, props) in enumerate(resources)
    ]


def check_stack(resources, policy="cost-within-budget"):
    violations = []
    POLICIES[policy].validate(
        StackValidationArgs(resources=policy_resources(resources)),
        lambda message, urn=None: violations.append(message),
    )
    return violations


POOL = {
    "vmSize": "Standard_ND96isr_H100_v5",
    "interNodeCommunication": "Enabled",
    "targetNodeCommunicationMode": "Simplified",
    "networkConfiguration": {"publicIPAddressConfiguration": {"provision": "NoPublicIPAddresses"}},
    "scaleSettings": {"fixedScale": {"targetDedicatedNodes": 2}},
    "metadata": [{"name": "checkpointing", "value": "true"}],
}
STORAGE = {
    "kind": "StorageV2",
    "enableHttpsTrafficOnly": True,
    "minimumTlsVersion": "TLS1_2",
    "allowSharedKeyAccess": False,
    "allowBlobPublicAccess": False,
    "networkRuleSet": {"defaultAction": "Deny"},
    "tags": TAGS,
}
WORKSPACE = {"publicNetworkAccess": "Disabled", "systemDatastoresAuthMode": "Identity"}
COMPUTE = {
    "properties": {
        "computeType": "AmlCompute",
        "disableLocalAuth": True,
        "properties": {
            "vmSize": "Standard_ND96isr_H100_v5",
            "vmPriority": "Dedicated",
            "enableNodePublicIp": False,
            "remoteLoginPortPublicAccess": "Disabled",
            "subnet": {"id": "/subscriptions/s/resourceGroups/g/providers/x/compute"},
            "scaleSettings": {"minNodeCount": 0, "maxNodeCount": 2},
        },
    }
}
AML = ["properties", "properties"]
AML_JOB = {
    "properties": {
        "jobType": "Command",
        "command": "exec python -m trainer.launch --platform azureml -- python -m trainer",
        "computeId": "/subscriptions/s/resourceGroups/g/providers/x/workspaces/w/computes/c",
        "environmentId": "/subscriptions/s/resourceGroups/g/providers/x/environments/trainer/1",
        "identity": {"identityType": "Managed", "resourceId": "/subscriptions/s/x/nodes"},
    }
}
VAULT = {
    "properties": {
        "enableRbacAuthorization": True,
        "enablePurgeProtection": True,
        "networkAcls": {"defaultAction": "Deny", "bypass": "AzureServices"},
    }
}
INBOUND = {
    "name": "r",
    "direction": "Inbound",
    "access": "Allow",
    "protocol": "*",
    "sourceAddressPrefix": "10.20.0.0/20",
    "destinationPortRange": "2049",
}


def changed(base, path, value):
    out = copy.deepcopy(base)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


# A Spot pool as `spot: true` declares it: its nodes through the low-priority field only.
SPOT_POOL = changed(
    changed(POOL, ["scaleSettings", "fixedScale", "targetDedicatedNodes"], 0),
    ["scaleSettings", "fixedScale", "targetLowPriorityNodes"],
    4,
)

CASES = [
    (
        "no-public-ip-on-pool-nodes",
        "azure-native:batch:Pool",
        POOL,
        changed(
            POOL,
            ["networkConfiguration", "publicIPAddressConfiguration", "provision"],
            "BatchManaged",
        ),
        "public IPs",
    ),
    (
        "no-public-ip-on-pool-nodes",
        "azure-native:batch:Pool",
        POOL,
        changed(POOL, ["targetNodeCommunicationMode"], "Classic"),
        "simplified",
    ),
    (
        "no-public-ip-on-nics",
        "azure-native:network:NetworkInterface",
        {"ipConfigurations": [{"name": "primary", "privateIPAddress": "10.20.16.4"}]},
        {"ipConfigurations": [{"name": "primary", "publicIPAddress": {"id": "/pip"}}]},
        "public IP",
    ),
    (
        "storage-secure-access",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["enableHttpsTrafficOnly"], False),
        "enableHttpsTrafficOnly",
    ),
    (
        "storage-secure-access",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["minimumTlsVersion"], "TLS1_0"),
        "TLS1_2",
    ),
    (
        "storage-secure-access",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["allowSharedKeyAccess"], True),
        "allowSharedKeyAccess",
    ),
    (
        "storage-secure-access",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["allowBlobPublicAccess"], True),
        "allowBlobPublicAccess",
    ),
    (
        "storage-secure-access",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["networkRuleSet", "defaultAction"], "Allow"),
        "Deny",
    ),
    (
        "registry-admin-user-off",
        "azure-native:containerregistry:Registry",
        {"adminUserEnabled": False, "anonymousPullEnabled": False},
        {"adminUserEnabled": True},
        "adminUserEnabled",
    ),
    (
        "registry-admin-user-off",
        "azure-native:containerregistry:Registry",
        {},
        {"anonymousPullEnabled": True},
        "anonymousPullEnabled",
    ),
    (
        "nsg-no-internet-inbound",
        "azure-native:network:NetworkSecurityGroup",
        {"securityRules": [INBOUND]},
        {"securityRules": [changed(INBOUND, ["sourceAddressPrefix"], "Internet")]},
        "internet",
    ),
    (
        "nsg-no-internet-inbound",
        "azure-native:network:SecurityRule",
        INBOUND,
        changed(INBOUND, ["sourceAddressPrefix"], "52.160.0.0/16"),
        "internet",
    ),
    (
        "nsg-no-internet-inbound",
        "azure-native:network:NetworkSecurityGroup",
        {"securityRules": [changed(INBOUND, ["access"], "Deny") | {"sourceAddressPrefix": "*"}]},
        {"securityRules": [changed(INBOUND, ["sourceAddressPrefix"], "*")]},
        "internet",
    ),
    (
        "pool-infiniband-size",
        "azure-native:batch:Pool",
        POOL,
        changed(POOL, ["vmSize"], "Standard_NC6s_v3"),
        "InfiniBand",
    ),
    (
        "pool-infiniband-size",
        "azure-native:batch:Pool",
        POOL,
        changed(POOL, ["vmSize"], "Standard_ND96isr_MI300X_v5"),
        "AMD GPUs, which run ROCm",
    ),
    (
        "pool-infiniband-size",
        "azure-native:batch:Pool",
        POOL,
        changed(POOL, ["interNodeCommunication"], "Disabled"),
        "interNodeCommunication",
    ),
    (
        "required-tags",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["tags"], {"team": "vision"}),
        "project, stack, cost-center",
    ),
    # Spot nodes (low-priority fields) make the whole pool or none of it, and checkpoint.
    (
        "spot-pool-whole-and-checkpointed",
        "azure-native:batch:Pool",
        SPOT_POOL,
        changed(POOL, ["scaleSettings", "fixedScale", "targetLowPriorityNodes"], 2),
        "dedicated and 2 Spot (low-priority) nodes in one pool",
    ),
    (
        "spot-pool-whole-and-checkpointed",
        "azure-native:batch:Pool",
        changed(
            POOL,
            ["scaleSettings"],
            {
                "autoScale": {
                    "formula": "$TargetLowPriorityNodes = $busy ? 3 : 0;\n"
                    "$TargetDedicatedNodes = 0;"
                }
            },
        ),
        changed(
            POOL,
            ["scaleSettings"],
            {
                "autoScale": {
                    "formula": "$TargetDedicatedNodes = $busy ? 2 : 0;\n"
                    "$TargetLowPriorityNodes = $busy ? 3 : 0;"
                }
            },
        ),
        "2 dedicated and 3 Spot (low-priority) nodes",
    ),
    (
        "spot-pool-whole-and-checkpointed",
        "azure-native:batch:Pool",
        SPOT_POOL,
        changed(SPOT_POOL, ["metadata"], [{"name": "checkpointing", "value": "false"}]),
        "4 Spot nodes without checkpointing",
    ),
]


REGISTRY = {
    "publicNetworkAccess": "Enabled",
    "policies": {"exportPolicy": {"status": "enabled"}},
}
BLOB_DIAGNOSTICS = {
    "resourceUri": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/"
    "storageAccounts/a/blobServices/default",
    "metrics": [{"category": "Transaction", "enabled": True}],
}
CASES += [
    (
        "acr-export-policy-needs-private-registry",
        "azure-native:containerregistry:Registry",
        REGISTRY,
        changed(REGISTRY, ["policies", "exportPolicy", "status"], "disabled"),
        "ACR refuses it",
    ),
    (
        "storage-service-metric-categories",
        "azure-native:monitor:DiagnosticSetting",
        BLOB_DIAGNOSTICS,
        changed(BLOB_DIAGNOSTICS, ["metrics"], [{"category": "AllMetrics", "enabled": True}]),
        "'AllMetrics' on a storage service",
    ),
    (
        "storage-ip-rules-public",
        "azure-native:storage:StorageAccount",
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "20.1.2.0/24"}]),
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "20.1.2.4/32"}]),
        "Azure storage takes /30 or larger ranges",
    ),
    (
        "storage-ip-rules-public",
        "azure-native:storage:StorageAccount",
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "20.1.2.4"}]),
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "10.0.0.0/16"}]),
        "not a public address (10.0.0.0/8",
    ),
    (
        "storage-ip-rules-public",
        "azure-native:storage:StorageAccount",
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "20.1.0.0/16"}]),
        changed(STORAGE, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "0.0.0.0/0"}]),
        "(the whole internet), wider than the /16",
    ),
    (
        "registry-ip-rules-public",
        "azure-native:containerregistry:Registry",
        changed(REGISTRY, ["networkRuleSet"], {"ipRules": [{"iPAddressOrRange": "20.1.2.4"}]}),
        changed(REGISTRY, ["networkRuleSet"], {"ipRules": [{"iPAddressOrRange": "0.0.0.0/0"}]}),
        "registry IP rule 0.0.0.0/0: a /0 is 4,294,967,296 addresses (the whole internet)",
    ),
    (
        "registry-ip-rules-public",
        "azure-native:containerregistry:Registry",
        REGISTRY,
        changed(REGISTRY, ["networkRuleSet"], {"ipRules": [{"iPAddressOrRange": "52.0.0.0/8"}]}),
        "wider than the /16",
    ),
    (
        "tags-within-azure-limits",
        "azure-native:storage:StorageAccount",
        STORAGE,
        changed(STORAGE, ["tags"], {**TAGS, "cost-center": "c" * 257}),
        "at most 256 characters",
    ),
    (
        "tags-within-azure-limits",
        "azure-native:network:VirtualNetwork",
        {"tags": TAGS},
        {"tags": {**TAGS, "a/b": "x"}},
        "contains /, which Azure refuses in tag names",
    ),
    (
        "budget-starts-on-the-first",
        "azure-native:consumption:Budget",
        {"timePeriod": {"startDate": "2026-11-01"}},
        {"timePeriod": {"startDate": "2026-11-22"}},
        "first day of a month",
    ),
    (
        "azureml-workspace-private",
        "azure-native:machinelearningservices:Workspace",
        WORKSPACE,
        changed(WORKSPACE, ["publicNetworkAccess"], "Enabled"),
        "publicNetworkAccess must be Disabled",
    ),
    (
        "azureml-workspace-private",
        "azure-native:machinelearningservices:Workspace",
        WORKSPACE,
        changed(WORKSPACE, ["systemDatastoresAuthMode"], "AccessKey"),
        "systemDatastoresAuthMode='AccessKey'",
    ),
    *(
        (
            "azureml-compute-private",
            "azure-native:machinelearningservices:Compute",
            COMPUTE,
            bad,
            why,
        )
        for bad, why in [
            (changed(COMPUTE, [*AML, "enableNodePublicIp"], True), "enableNodePublicIp"),
            (
                changed(COMPUTE, [*AML, "remoteLoginPortPublicAccess"], "NotSpecified"),
                "remoteLoginPortPublicAccess must be Disabled",
            ),
            (changed(COMPUTE, [*AML, "subnet"], None), "compute subnet"),
            (changed(COMPUTE, ["properties", "disableLocalAuth"], False), "disableLocalAuth"),
            (
                changed(COMPUTE, [*AML, "vmSize"], "Standard_NC6s_v3"),
                "vmSize='Standard_NC6s_v3': not an InfiniBand GPU size",
            ),
            (
                changed(COMPUTE, ["properties", "computeType"], "ComputeInstance"),
                "computeType='ComputeInstance'",
            ),
        ]
    ),
    *(
        (
            "azureml-job-on-stack-compute",
            "azure-native:machinelearningservices:Job",
            AML_JOB,
            bad,
            why,
        )
        for bad, why in [
            (changed(AML_JOB, ["properties", "computeId"], None), "no serverless compute"),
            (
                changed(AML_JOB, ["properties", "identity"], {"identityType": "AMLToken"}),
                "identity.identityType='AMLToken'",
            ),
            (changed(AML_JOB, ["properties", "environmentId"], ""), "trainer environment"),
            (changed(AML_JOB, ["properties", "jobType"], "Pipeline"), "jobType='Pipeline'"),
        ]
    ),
    (
        "key-vault-secure",
        "azure-native:keyvault:Vault",
        VAULT,
        changed(VAULT, ["properties", "enableRbacAuthorization"], False),
        "enableRbacAuthorization",
    ),
    (
        "key-vault-secure",
        "azure-native:keyvault:Vault",
        VAULT,
        changed(VAULT, ["properties", "enablePurgeProtection"], False),
        "enablePurgeProtection",
    ),
    (
        "key-vault-secure",
        "azure-native:keyvault:Vault",
        VAULT,
        changed(VAULT, ["properties", "networkAcls", "defaultAction"], "Allow"),
        "networkAcls.defaultAction must be Deny",
    ),
]


# Each address or range the registry and storage IP rules refuse, and why (the same function
# refuses them in the stack's settings: tests/infra/test_stack_config.py).
REFUSED_RULES = [
    ("0.0.0.0/0", "the whole internet"),
    ("0.0.0.0/1", "wider than the /16"),
    ("52.0.0.0/15", "wider than the /16"),
    ("10.1.2.3", "10.0.0.0/8 is private"),
    ("172.20.0.0/16", "172.16.0.0/12 is private"),
    ("192.168.0.0/24", "192.168.0.0/16 is private"),
    ("100.64.0.1", "100.64.0.0/10 is private"),
    ("127.0.0.1", "127.0.0.0/8 is private"),
    ("169.254.169.254", "169.254.0.0/16 is private"),
    ("224.0.0.1", "224.0.0.0/4"),
    ("2001:db8::/32", "not an IPv4 address or range"),
    ("laptop", "not an IPv4 address or range"),
]


@pytest.mark.parametrize(("value", "message"), REFUSED_RULES)
@pytest.mark.parametrize(
    ("policy", "typ", "base"),
    [
        ("registry-ip-rules-public", "azure-native:containerregistry:Registry", REGISTRY),
        ("storage-ip-rules-public", "azure-native:storage:StorageAccount", STORAGE),
    ],
)
def test_ip_rules_refuse_private_and_internet_wide_ranges(policy, typ, base, value, message):
    rules = [{"iPAddressOrRange": "20.1.2.4"}, {"iPAddressOrRange": value}]
    props = changed(base, ["networkRuleSet"], {"defaultAction": "Deny", "ipRules": rules})
    violations = check(policy, typ, props)
    assert len(violations) == 1 and message in violations[0], violations
    # The RFC 5737 documentation ranges stay usable (examples, and the plan's mocked NAT IP).
    ok = changed(props, ["networkRuleSet", "ipRules"], [{"iPAddressOrRange": "203.0.113.10"}])
    assert check(policy, typ, ok) == []


def test_tag_names_over_128_characters_are_refused():
    long_name = {"tags": {**TAGS, "n" * 129: "v"}}
    violations = check("tags-within-azure-limits", "azure-native:compute:Disk", long_name)
    assert violations and "has 129 characters; Azure takes 1..128" in violations[0]
    assert check("tags-within-azure-limits", "azure-native:compute:Disk", {"tags": "x"})


@pytest.mark.parametrize(("policy", "typ", "good", "bad", "message"), CASES)
def test_policy_passes_compliant_and_reports_violating(policy, typ, good, bad, message):
    assert check(policy, typ, good) == []
    violations = check(policy, typ, bad)
    assert violations and message in " ".join(violations)


def test_nfs_file_storage_is_exempt_from_https_only():
    files = changed(STORAGE, ["enableHttpsTrafficOnly"], False) | {"kind": "FileStorage"}
    assert check("storage-secure-access", "azure-native:storage:StorageAccount", files) == []


def test_every_resource_policy_has_a_case():
    tested = {case[0] for case in CASES}
    assert tested == {p.name for p in ALL_POLICIES} - STACK_POLICIES


EXTRA = {
    "": {},
    "an AzureML workspace": {"gpu-cluster:azuremlWorkspace": True},
    "the AzureML backend": {"gpu-cluster:backend": "azureml"},
}


@pytest.mark.parametrize(
    "stack", ["dev", "vision-prod", "dev with an AzureML workspace", "dev with the AzureML backend"]
)
def test_both_stacks_pass_every_policy(stack):
    from dt_commands.plan import evaluate
    from tests.support.stacks import stack_values

    name, _, extra = stack.partition(" with ")
    values = stack_values(name) | EXTRA[extra]
    plan = evaluate(name, values)
    for resource in plan.resources:
        for name in POLICIES:
            if name not in STACK_POLICIES:
                assert check(name, resource.typ, resource.inputs) == [], (name, resource.name)
    taggable = [r for r in plan.resources if r.typ in TAGGABLE]
    assert len(taggable) >= 10
    assert check_stack([(r.typ, r.inputs) for r in plan.resources]) == []


CPU_POOL = changed(POOL, ["vmSize"], "Standard_D2ds_v5")


def test_the_cpu_acceptance_size_passes_only_on_a_pool_that_declares_it():
    declared = changed(
        CPU_POOL, ["metadata"], [*POOL["metadata"], {"name": "acceptance", "value": "cpu"}]
    )
    assert check("pool-infiniband-size", "azure-native:batch:Pool", declared) == []
    # A normal stack's pool on the same size is refused as before.
    assert "not an InfiniBand GPU size" in " ".join(
        check("pool-infiniband-size", "azure-native:batch:Pool", CPU_POOL)
    )
    # The metadata admits the CPU acceptance size only, and never turns off the other rules.
    other = changed(declared, ["vmSize"], "Standard_D4s_v5")
    assert check("pool-infiniband-size", "azure-native:batch:Pool", other)
    gpu_profile = changed(declared, ["metadata"], [{"name": "acceptance", "value": "gpu"}])
    assert check("pool-infiniband-size", "azure-native:batch:Pool", gpu_profile)
    isolated = changed(declared, ["interNodeCommunication"], "Disabled")
    assert "interNodeCommunication" in " ".join(
        check("pool-infiniband-size", "azure-native:batch:Pool", isolated)
    )


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_acceptance_stacks_pass_every_policy(profile):
    from dt_commands.plan import evaluate
    from tests.support.stacks import acceptance_options, acceptance_values

    plan = evaluate(acceptance_options(profile).stack_name, acceptance_values(profile))
    for resource in plan.resources:
        for name in POLICIES:
            if name not in STACK_POLICIES:
                assert check(name, resource.typ, resource.inputs) == [], (name, resource.name)
    assert check_stack([(r.typ, r.inputs) for r in plan.resources]) == []  # budget covers it


def test_cost_over_budget_or_without_budget_is_a_violation():
    from dt_commands.plan import evaluate
    from tests.support.stacks import stack_values

    plan = evaluate("vision-prod", stack_values("vision-prod"))
    resources = [(r.typ, r.inputs) for r in plan.resources]
    tight = [(t, p | {"amount": 1000} if t.endswith(":Budget") else p) for t, p in resources]
    assert any("exceeds the budget of $1,000" in v for v in check_stack(tight))
    unbudgeted = [(t, p) for t, p in resources if not t.endswith(":Budget")]
    assert any("no budget" in v for v in check_stack(unbudgeted))


def test_the_azureml_backends_compute_is_priced_as_the_settings_price_it():
    """The pack reads the cluster's size, most nodes, priority and scale-down from the compute
    as declared, and reaches the plan's own estimate (infra.cost, from the settings)."""
    from dt_commands.plan import evaluate
    from infra import cost
    from policy.rules import cost_inputs
    from tests.support.stacks import stack_values

    for extra in ({}, {"gpu-cluster:spot": True, "gpu-cluster:scaleMode": "fixed"}):
        values = stack_values("dev") | EXTRA["the AzureML backend"] | extra
        plan = evaluate("dev", values)
        read = cost_inputs(policy_resources([(r.typ, r.inputs) for r in plan.resources]))
        assert read is not None
        assert cost.monthly_cost(read) == cost.monthly_cost(plan.settings.cost_inputs())
        assert read.spot == bool(extra) and read.always_on == bool(extra)
    resources = [(t, p) for t, p in [(r.typ, r.inputs) for r in plan.resources]]
    tight = [(t, p | {"amount": 1000} if t.endswith(":Budget") else p) for t, p in resources]
    assert any("exceeds the budget of $1,000" in v for v in check_stack(tight))
