"""The guardrails every gpu-cluster stack must pass (mandatory).

Each rule reads the camelCase inputs Pulumi hands to policies, so it checks what a resource says
rather than how we build it. This is this program's own pack (ARCHITECTURE.md): the facts it
checks against (supported sizes, required tags, prices) are the program's tables, imported, not
a second copy; the tables answer to Azure's documented constraints in their own tests.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra import cost
from infra.ip_rules import ip_rule_problem
from infra.naming import REQUIRED_TAGS, TAGGABLE, tag_problem
from infra.sizes import CPU_ACCEPTANCE, NOT_YET, SUPPORTED

POOL = "azure-native:batch:Pool"
STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
AZUREML_WORKSPACE = "azure-native:machinelearningservices:Workspace"
AZUREML_COMPUTE = "azure-native:machinelearningservices:Compute"
_OPEN_SOURCES = {"*", "internet", "any", "0.0.0.0/0", "::/0"}

Validate = Callable[[ResourceValidationArgs, ReportViolation], None]


def _for(resource_type: str | frozenset[str]) -> Callable[[Validate], Validate]:
    """Run the decorated check only for the given type(s)."""
    types = {resource_type} if isinstance(resource_type, str) else set(resource_type)

    def wrap(check: Validate) -> Validate:
        def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
            if args.resource_type in types:
                check(args, report)

        validate.__doc__ = check.__doc__
        return validate

    return wrap


def _mandatory(name: str, validate: Validate) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(
        name=name,
        description=(validate.__doc__ or "").strip(),
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


# ---------------------------------------------------------------- resource rules
@_for(POOL)
def _pool_without_public_ips(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Batch pool nodes get no public IP and use simplified node communication."""
    network = args.props.get("networkConfiguration") or {}
    provision = (network.get("publicIPAddressConfiguration") or {}).get("provision")
    if provision != "NoPublicIPAddresses":
        report(
            f"pool nodes get public IPs (provision={provision!r}); set NoPublicIPAddresses", None
        )
    if args.props.get("targetNodeCommunicationMode") != "Simplified":
        report("pool must use simplified node communication (no inbound management ports)", None)


@_for("azure-native:network:NetworkInterface")
def _nic_without_public_ip(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Network interfaces (the NFS server's included) carry no public IP."""
    for config in args.props.get("ipConfigurations") or []:
        if config.get("publicIPAddress"):
            report(f"ip configuration {config.get('name')!r} has a public IP", None)


@_for(STORAGE_ACCOUNT)
def _storage_secure(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Storage: HTTPS only, TLS 1.2, shared keys off, no public blobs, network default deny."""
    props = args.props
    # NFS 4.1 on Azure Files cannot use HTTPS; its network rules are its protection.
    if props.get("kind") != "FileStorage" and props.get("enableHttpsTrafficOnly") is not True:
        report("enableHttpsTrafficOnly must be true", None)
    if props.get("minimumTlsVersion") != "TLS1_2":
        report(f"minimumTlsVersion={props.get('minimumTlsVersion')!r}: require TLS1_2", None)
    if props.get("allowSharedKeyAccess") is not False:
        report("allowSharedKeyAccess must be false: use Entra ID and managed identities", None)
    if props.get("allowBlobPublicAccess") is not False:
        report("allowBlobPublicAccess must be false", None)
    if (props.get("networkRuleSet") or {}).get("defaultAction") != "Deny":
        report("networkRuleSet.defaultAction must be Deny (the SDK default is Allow)", None)


@_for("azure-native:containerregistry:Registry")
def _registry_admin_off(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Container registry: admin user and anonymous pull off (pull and push by identity)."""
    if args.props.get("adminUserEnabled"):
        report("adminUserEnabled must be false: grant AcrPull/AcrPush to identities", None)
    if args.props.get("anonymousPullEnabled"):
        report("anonymousPullEnabled must be false", None)


@_for(AZUREML_WORKSPACE)
def _azureml_workspace_private(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """AzureML workspace: public network access off (a private endpoint reaches it) and its
    system datastores by identity (the storage has no shared keys to hand out)."""
    if args.props.get("publicNetworkAccess") != "Disabled":
        report("publicNetworkAccess must be Disabled: reach it through its private endpoint", None)
    if args.props.get("systemDatastoresAuthMode") != "Identity":
        report(
            f"systemDatastoresAuthMode={args.props.get('systemDatastoresAuthMode')!r}: use "
            "Identity (storage shared keys are off)",
            None,
        )


def _aml_compute(compute: Mapping[str, Any]) -> Mapping[str, Any]:
    """An AzureML compute's AmlCompute properties (empty for another kind of compute)."""
    outer = compute.get("properties") or {}
    return (outer.get("properties") or {}) if outer.get("computeType") == "AmlCompute" else {}


@_for(AZUREML_COMPUTE)
def _azureml_compute_private(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """AzureML compute cluster (backend: azureml): an InfiniBand GPU size, in the stack's
    subnet, no public IPs, no public SSH port, Entra tokens only."""
    outer = args.props.get("properties") or {}
    aml = _aml_compute(args.props)
    if outer.get("computeType") != "AmlCompute":
        report(f"computeType={outer.get('computeType')!r}: the stack's nodes are AmlCompute", None)
        return
    size = aml.get("vmSize")
    if size not in SUPPORTED:
        why = NOT_YET.get(str(size), "not an InfiniBand GPU size this program supports")
        report(f"vmSize={size!r}: {why}; use one of {', '.join(SUPPORTED)}", None)
    if aml.get("enableNodePublicIp") is not False:
        report("enableNodePublicIp must be false: the nodes go out through the NAT gateway", None)
    if aml.get("remoteLoginPortPublicAccess") != "Disabled":
        report("remoteLoginPortPublicAccess must be Disabled (no public SSH port)", None)
    if not (aml.get("subnet") or {}).get("id"):
        report("the compute must sit in the stack's compute subnet (subnet.id)", None)
    if outer.get("disableLocalAuth") is not True:
        report("disableLocalAuth must be true: Entra tokens only", None)


@_for("azure-native:machinelearningservices:Job")
def _azureml_job_on_stack_compute(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """AzureML job (backend: azureml): a command or sweep job on a compute cluster (never
    serverless compute, which sits outside the stack's network), running as a managed identity
    (not AzureML's token, which reaches the workspace's datastores with the workspace's own
    rights)."""
    props = args.props.get("properties") or {}
    kind = props.get("jobType")
    if kind not in ("Command", "Sweep"):
        report(f"jobType={kind!r}: the stack declares command and sweep jobs", None)
        return
    if not props.get("computeId"):
        report("computeId must name the stack's compute cluster (no serverless compute)", None)
    identity = (props.get("identity") or {}).get("identityType")
    if identity != "Managed":
        report(
            f"identity.identityType={identity!r}: the job runs as the nodes' identity (Managed)",
            None,
        )
    trial = (props.get("trial") or {}) if kind == "Sweep" else props
    if not trial.get("environmentId"):
        report("environmentId must name the stack's trainer environment", None)


@_for("azure-native:keyvault:Vault")
def _key_vault_secure(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Key vault: RBAC authorization, purge protection, network default deny."""
    props = args.props.get("properties") or {}
    if props.get("enableRbacAuthorization") is not True:
        report("enableRbacAuthorization must be true: grant roles, not access policies", None)
    if props.get("enablePurgeProtection") is not True:
        report("enablePurgeProtection must be true", None)
    if (props.get("networkAcls") or {}).get("defaultAction") != "Deny":
        report("networkAcls.defaultAction must be Deny", None)


def _open_to_internet(rule: Mapping[str, Any]) -> bool:
    sources = [rule.get("sourceAddressPrefix"), *(rule.get("sourceAddressPrefixes") or [])]
    for source in filter(None, sources):
        text = str(source).lower()
        if text in _OPEN_SOURCES:
            return True
        try:
            if not ipaddress.ip_network(text, strict=False).is_private:
                return True
        except ValueError:
            continue  # service tags such as VirtualNetwork or AzureLoadBalancer
    return False


@_for(frozenset({"azure-native:network:NetworkSecurityGroup", "azure-native:network:SecurityRule"}))
def _nsg_no_internet_inbound(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """No NSG rule allows inbound traffic from the internet."""
    rules = args.props.get("securityRules")
    for rule in rules if rules is not None else [args.props]:
        if (
            rule.get("direction") == "Inbound"
            and rule.get("access") == "Allow"
            and _open_to_internet(rule)
        ):
            report(f"rule {rule.get('name')!r} allows inbound traffic from the internet", None)


def _metadata(pool: Mapping[str, Any]) -> dict[str, Any]:
    return {m.get("name"): m.get("value") for m in pool.get("metadata") or []}


@_for(POOL)
def _pool_infiniband(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Pools use an InfiniBand GPU size with inter-node communication enabled; the CPU
    acceptance size only on a pool whose metadata says acceptance=cpu."""
    size = args.props.get("vmSize")
    # The throwaway stacks of python -m dt_commands.acceptance --profile cpu: a 2-vCPU size,
    # declared as such on the pool; any other pool on it is refused like any non-InfiniBand size.
    cpu_acceptance = size in CPU_ACCEPTANCE and _metadata(args.props).get("acceptance") == "cpu"
    if size not in SUPPORTED and not cpu_acceptance:
        why = NOT_YET.get(str(size), "not an InfiniBand GPU size this program supports")
        report(f"vmSize={size!r}: {why}; use one of {', '.join(SUPPORTED)}", None)
    if args.props.get("interNodeCommunication") != "Enabled":
        report("interNodeCommunication must be Enabled for multi-node training", None)


@_for(TAGGABLE)
def _required_tags(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Every taggable resource carries project, team, stack and cost-center tags."""
    tags = args.props.get("tags") or {}
    missing = [t for t in REQUIRED_TAGS if not tags.get(t)]
    if missing:
        report(f"missing tags: {', '.join(missing)}", None)


@_for(TAGGABLE)
def _tags_within_azure_limits(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Tag names of 1..128 characters without < > % & \\ ? /, values of at most 256 characters
    (infra.naming.tag_problem; articles/azure-resource-manager/management/tag-resources.md)."""
    tags = args.props.get("tags") or {}
    if not isinstance(tags, Mapping):
        report(f"tags={tags!r}: must map tag names to values", None)
        return
    problem = tag_problem(tags)
    if problem is not None:
        report(f"tag {problem[0][:40]!r}{problem[1]}", None)


def _pool_nodes(pool: Mapping[str, Any], kind: str) -> int:
    """A pool's ``Dedicated`` or ``LowPriority`` (Spot) node count, fixed or the most its
    autoscale formula asks for."""
    scale = pool.get("scaleSettings") or {}
    fixed = scale.get("fixedScale") or {}
    if fixed:
        return int(fixed.get(f"target{kind}Nodes") or 0)
    return _formula_count((scale.get("autoScale") or {}).get("formula", ""), f"Target{kind}Nodes")


def _formula_count(formula: str, variable: str) -> int:
    """The largest node count an autoscale formula assigns to ``$variable``."""
    statement = re.search(rf"\${variable}\s*=([^;]*);", formula)
    return (
        max((int(n) for n in re.findall(r"\d+", statement.group(1))), default=0) if statement else 0
    )


@_for(POOL)
def _spot_pool_whole_and_checkpointed(
    args: ResourceValidationArgs, report: ReportViolation
) -> None:
    """A pool's Spot nodes (Batch's low-priority fields, Spot since March 2026: Azure/Batch
    #196, read 2026-11-28) are all of it: whether one InfiniBand job may span Spot and
    dedicated nodes is not documented; and a Spot pool checkpoints, as an eviction restarts the
    job (infra.settings.cluster ClusterSettings._check_spot)."""
    spot, dedicated = _pool_nodes(args.props, "LowPriority"), _pool_nodes(args.props, "Dedicated")
    if spot and dedicated:
        report(
            f"{dedicated} dedicated and {spot} Spot (low-priority) nodes in one pool: whether an "
            "InfiniBand job may span both is not documented; make the pool all Spot (spot: true) "
            "or all dedicated",
            None,
        )
    if spot and _metadata(args.props).get("checkpointing") == "false":
        report(
            f"{spot} Spot nodes without checkpointing: an eviction restarts the job from step 0; "
            "set checkpointing true",
            None,
        )


# ------------------------------------------------ constraints Azure documents (each one an error
# ARM would return mid-deployment; caught at preview instead)
@_for("azure-native:containerregistry:Registry")
def _acr_export_policy(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A registry's export policy can be disabled only with public network access disabled
    (articles/container-registry/data-loss-prevention.md)."""
    export = ((args.props.get("policies") or {}).get("exportPolicy") or {}).get("status")
    public = args.props.get("publicNetworkAccess", "Enabled")
    if str(export).lower() == "disabled" and public != "Disabled":
        report(
            f"exportPolicy disabled with publicNetworkAccess {public}: ACR refuses it; enable "
            "the export policy or disable public network access",
            None,
        )


# Per storage service, the metric categories diagnostic settings accept (AllMetrics is a 400:
# Azure/azure-powershell #6520; articles/storage/blobs/monitor-blob-storage-reference.md).
_STORAGE_SERVICE_METRICS = {"Transaction", "Capacity"}


@_for("azure-native:monitor:DiagnosticSetting")
def _storage_service_metrics(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Diagnostic settings on storage services (blob, file, queue, table) ask only for the
    Transaction and Capacity metric categories."""
    uri = str(args.props.get("resourceUri") or "")
    if not re.search(r"/(blob|file|queue|table)Services/", uri):
        return
    for metric in args.props.get("metrics") or []:
        if metric.get("category") not in _STORAGE_SERVICE_METRICS:
            report(
                f"metric category {metric.get('category')!r} on a storage service: use "
                f"{' or '.join(sorted(_STORAGE_SERVICE_METRICS))}",
                None,
            )


def _ip_rule_violations(props: Mapping[str, Any], what: str, *, storage: bool) -> list[str]:
    """Each IP rule of a storage account or registry that is not a public IPv4 address or range
    of the size Azure and this design admit (``infra.ip_rules.ip_rule_problem``)."""
    out = []
    for rule in (props.get("networkRuleSet") or {}).get("ipRules") or []:
        value = str((rule or {}).get("iPAddressOrRange") or "")
        try:
            ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            out.append(f"{what} IP rule {value!r} is not an IPv4 address or range")
            continue
        problem = ip_rule_problem(value, storage=storage)
        if problem is not None:
            out.append(f"{what} IP rule {value}: {problem}")
    return out


@_for(STORAGE_ACCOUNT)
def _storage_ip_rules(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Storage IP rules name public addresses, ranges /30 or larger
    (articles/storage/common/storage-network-security-ip-address-range.md) and no wider than a
    /16 (infra.ip_rules.MIN_ALLOWED_PREFIX: the network rule set stays default-deny)."""
    for violation in _ip_rule_violations(args.props, "storage", storage=True):
        report(violation, None)


@_for("azure-native:containerregistry:Registry")
def _registry_ip_rules(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Registry IP rules name public addresses (they filter the public endpoint only; private
    traffic comes through a private endpoint) no wider than a /16 (infra.ip_rules.
    MIN_ALLOWED_PREFIX), so 0.0.0.0/0 cannot undo the default-deny rule set
    (articles/container-registry/container-registry-access-selected-networks.md)."""
    for violation in _ip_rule_violations(args.props, "registry", storage=False):
        report(violation, None)


@_for("azure-native:consumption:Budget")
def _budget_start(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A budget's period starts on the first of a month; ARM refuses other start dates."""
    start = str((args.props.get("timePeriod") or {}).get("startDate") or "")
    if not re.fullmatch(r"\d{4}-\d{2}-01(T00:00:00Z)?", start):
        report(f"budget startDate {start!r}: must be the first day of a month (YYYY-MM-01)", None)


# ---------------------------------------------------------------- stack rule
def cost_inputs(resources: list[Any]) -> cost.CostInputs | None:
    """What the estimate needs, read from the declared resources; None without a pool or an
    AzureML compute cluster."""
    pools = [r.props for r in resources if r.resource_type == POOL]
    computes = [_aml_compute(r.props) for r in resources if r.resource_type == AZUREML_COMPUTE]
    if not pools and computes:
        return _compute_cost_inputs(computes[0], resources)
    if not pools:
        return None
    pool = pools[0]
    vms = [r.props for r in resources if r.resource_type == "azure-native:compute:VirtualMachine"]
    disks = [r.props for r in resources if r.resource_type == "azure-native:compute:Disk"]
    shares = [
        r.props
        for r in resources
        if r.resource_type == "azure-native:storage:FileShare"
        and r.props.get("enabledProtocols") == "NFS"
    ]
    return cost.CostInputs(
        gpu_size=pool.get("vmSize", ""),
        nodes=_pool_nodes(pool, "Dedicated") + _pool_nodes(pool, "LowPriority"),
        spot=_pool_nodes(pool, "LowPriority") > 0,
        always_on=bool((pool.get("scaleSettings") or {}).get("fixedScale")),
        nfs_vm_size=(vms[0].get("hardwareProfile") or {}).get("vmSize") if vms else None,
        nfs_disk_gb=sum(int(d.get("diskSizeGB") or 0) for d in disks),
        files_share_gb=sum(int(s.get("shareQuota") or 0) for s in shares),
        azureml_workspace=any(r.resource_type == AZUREML_WORKSPACE for r in resources),
    )


def _compute_cost_inputs(aml: Mapping[str, Any], resources: list[Any]) -> cost.CostInputs:
    """The AzureML backend's estimate: its cluster's most nodes, always on when it never
    scales below them; no NFS server."""
    scale = aml.get("scaleSettings") or {}
    most = int(scale.get("maxNodeCount") or 0)
    return cost.CostInputs(
        gpu_size=str(aml.get("vmSize") or ""),
        nodes=most,
        spot=aml.get("vmPriority") == "LowPriority",
        always_on=most > 0 and int(scale.get("minNodeCount") or 0) >= most,
        azureml_workspace=any(r.resource_type == AZUREML_WORKSPACE for r in resources),
    )


def _cost_within_budget(args: StackValidationArgs, report: ReportViolation) -> None:
    """The estimated monthly cost stays within the stack's consumption budget."""
    budgets = [
        r.props for r in args.resources if r.resource_type == "azure-native:consumption:Budget"
    ]
    inputs = cost_inputs(list(args.resources))
    if inputs is None:
        return
    if not budgets:
        report("the stack has no budget: set gpu-cluster:budget (USD per month)", None)
        return
    amount = float(budgets[0].get("amount") or 0)
    estimate = cost.total(cost.monthly_cost(inputs))
    if estimate > amount:
        report(
            f"estimated ${estimate:,.0f}/month exceeds the budget of ${amount:,.0f}; "
            "raise gpu-cluster:budget or shrink the pool",
            None,
        )


# The TrainingJob (infra/job.py): every dynamic resource has this type; its props tell it apart.
JOB = "pulumi-python:dynamic:Resource"
# A production stack, as this program's stacks are named (<team>-prod: Pulumi.vision-prod.yaml).
PRODUCTION_STACK = re.compile(r"(^|-)prod(uction)?$")


def _no_debugger_on_production(args: StackValidationArgs, report: ReportViolation) -> None:
    """On a production stack (its name ends in prod or production) no job waits for a debugger
    (trainer setting debug_rank: every rank idles until someone attaches) unless the stack sets
    allowDebugger (pool metadata debugger=allowed)."""
    allowed = any(
        _metadata(r.props).get("debugger") == "allowed"
        for r in args.resources
        if r.resource_type == POOL
    )
    for job in args.resources:
        flags = list(job.props.get("trainer_args") or []) if job.resource_type == JOB else []
        stack = str(job.props.get("stack") or "")
        if "--debug-rank" in flags and PRODUCTION_STACK.search(stack) and not allowed:
            rank = next(iter(flags[flags.index("--debug-rank") + 1 :]), "?")
            report(
                f"job {job.name}: debug_rank={rank} on production stack {stack} (every rank "
                "waits until a debugger attaches); remove debug_rank from its trainer settings "
                "or set gpu-cluster:allowDebugger true",
                job.urn,
            )


RESOURCE_RULES: dict[str, Validate] = {
    "no-public-ip-on-pool-nodes": _pool_without_public_ips,
    "no-public-ip-on-nics": _nic_without_public_ip,
    "storage-secure-access": _storage_secure,
    "registry-admin-user-off": _registry_admin_off,
    "nsg-no-internet-inbound": _nsg_no_internet_inbound,
    "pool-infiniband-size": _pool_infiniband,
    "required-tags": _required_tags,
    "spot-pool-whole-and-checkpointed": _spot_pool_whole_and_checkpointed,
    "acr-export-policy-needs-private-registry": _acr_export_policy,
    "storage-service-metric-categories": _storage_service_metrics,
    "storage-ip-rules-public": _storage_ip_rules,
    "registry-ip-rules-public": _registry_ip_rules,
    "tags-within-azure-limits": _tags_within_azure_limits,
    "budget-starts-on-the-first": _budget_start,
    "azureml-workspace-private": _azureml_workspace_private,
    "azureml-compute-private": _azureml_compute_private,
    "azureml-job-on-stack-compute": _azureml_job_on_stack_compute,
    "key-vault-secure": _key_vault_secure,
}
ALL_POLICIES: list[Policy] = [
    *(_mandatory(name, check) for name, check in RESOURCE_RULES.items()),
    StackValidationPolicy(
        name="cost-within-budget",
        description=(_cost_within_budget.__doc__ or "").strip(),
        validate=_cost_within_budget,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    StackValidationPolicy(
        name="no-debugger-on-production",
        description=(_no_debugger_on_production.__doc__ or "").strip(),
        validate=_no_debugger_on_production,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
