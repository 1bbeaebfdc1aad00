"""The rules that span sections, each taking the sections it relates: the acceptance size against
the profile, the region against the pool's size, the compute subnet against the pool, the
registry against the machine that pushes, the jobs against the pool, the network and
``replaceJobs``, where the runs are tracked against the stack's workspace, and the backend against
the acceptance profile and the jobs. A section checks
its own fields (``check()``); ``StackSettings`` runs both."""

from __future__ import annotations

from collections.abc import Sequence

from infra.settings.azureml import AzuremlSettings
from infra.settings.checks import ConfigError
from infra.settings.cluster import ClusterSettings
from infra.settings.image import ImageSettings
from infra.settings.jobs import JobSettings
from infra.settings.network import NetworkSettings
from infra.settings.tracking import TrackingSettings
from infra.sizes import CPU_ACCEPTANCE


def check_acceptance_size(profile: str, cluster: ClusterSettings) -> None:
    """The CPU size exists for acceptance stacks only: any other stack that names it gets the
    same error as any other non-InfiniBand size (``ClusterSettings.check``)."""
    if profile == "cpu" and cluster.vm_size not in CPU_ACCEPTANCE:
        raise ConfigError(
            f"vmSize={cluster.vm_size}: acceptanceProfile cpu runs on the CPU acceptance size; "
            f"use {', '.join(CPU_ACCEPTANCE)}"
        )


def check_location(location: str, cluster: ClusterSettings) -> None:
    if location not in cluster.gpu.regions:
        raise ConfigError(
            f"location={location}: {cluster.vm_size} is not offered there "
            f"in our table; use one of {', '.join(sorted(cluster.gpu.regions))}"
        )


def check_subnet_room(network: NetworkSettings, cluster: ClusterSettings) -> None:
    """Azure keeps 5 addresses per subnet; Batch needs one per node plus headroom for replacing
    nodes."""
    compute, max_nodes = network.compute_subnet, cluster.node_count
    if compute.num_addresses - 5 < 2 * max_nodes:
        raise ConfigError(
            f"computeSubnetCidr={compute}: too small for {max_nodes} nodes; use a larger range"
        )


def check_image_push(image: ImageSettings, network: NetworkSettings) -> None:
    """The docker builder pushes, and its token exchange comes, from this machine, which the
    registry's network rules admit only through registryAllowedIps (infra/registry.py)."""
    if image.builds and image.builder == "docker" and not network.registry_allowed_ips:
        raise ConfigError(
            "imageBuilder=docker: the image is pushed from the machine running pulumi up, "
            "and the registry's firewall admits no such address (registryAllowedIps is "
            "empty); add its public address to registryAllowedIps, or use imageBuilder acr"
        )


def check_jobs(
    jobs: Sequence[JobSettings],
    cluster: ClusterSettings,
    network: NetworkSettings,
    replace_jobs: Sequence[str],
) -> None:
    names = [job.name for job in jobs]
    pool_nodes = cluster.node_count
    for job in jobs:
        if job.nodes > pool_nodes:
            raise ConfigError(
                f"jobs.{job.name}.nodes={job.nodes}: the pool has {pool_nodes} nodes "
                "(nodeCount); use at most that many"
            )
        sweep = job.sweep
        if sweep is not None and sweep.concurrent_trials * job.nodes > pool_nodes:
            raise ConfigError(
                f"jobs.{job.name}.sweep.concurrentTrials={sweep.concurrent_trials}: each trial "
                f"takes {job.nodes} node(s) and the compute cluster has {pool_nodes} (nodeCount), "
                f"so at most {pool_nodes // job.nodes} run at once; lower it or raise nodeCount"
            )
        # `pulumi up` uploads the code into the data account, whose firewall admits only
        # these addresses and the VNet (infra/code_upload.py).
        if job.code is not None and not network.storage_allowed_ips:
            raise ConfigError(
                f"jobs.{job.name}.code={job.code.folder!r}: `pulumi up` uploads it to the "
                "data storage account, whose firewall admits no deployer's address "
                "(storageAllowedIps is empty); add the public address of the machine "
                "that runs `pulumi up` to storageAllowedIps"
            )
    unknown = sorted(set(replace_jobs) - set(names))
    if unknown:
        raise ConfigError(
            f"replaceJobs={list(replace_jobs)}: no job named {unknown[0]!r}; the "
            f"stack's jobs are {', '.join(names) or 'none'}"
        )


def check_tracking(tracking: TrackingSettings, azureml: AzuremlSettings) -> None:
    """The stack's runs go to one place: its server (trackingUri) or its workspace
    (azuremlWorkspace, or the AzureML backend's), and an experiment needs one of them."""
    if tracking.uri and azureml.declares_workspace:
        given = "backend=azureml" if azureml.on_azureml else "azuremlWorkspace=true"
        instead = "set backend batch" if azureml.on_azureml else "set azuremlWorkspace false"
        raise ConfigError(
            f"trackingUri={tracking.uri!r} with {given}: the jobs track in one place; remove "
            f"trackingUri to track in the stack's workspace, or {instead} to track on that "
            "server"
        )
    if tracking.experiment and not (tracking.uri or azureml.declares_workspace):
        raise ConfigError(
            f"trackingExperiment={tracking.experiment!r} without trackingUri or "
            "azuremlWorkspace: set trackingUri to the MLflow server's URL or azuremlWorkspace "
            "true, or remove trackingExperiment"
        )


def check_backend(
    azureml: AzuremlSettings, acceptance_profile: str, jobs: Sequence[JobSettings]
) -> None:
    """What the AzureML backend runs: the stack's jobs as native command jobs on its compute
    (infra.azureml_job). The acceptance check drives a Batch pool's nodes; an AzureML compute
    cluster queues its jobs without a priority (JobResourceConfiguration and QueueSettings carry
    none): each refused in one line rather than dropped. A multi-node job's size has InfiniBand
    already (ClusterSettings.check refuses any other size outside acceptance stacks)."""
    if not azureml.on_azureml:
        for job in jobs:
            if job.sweep is not None:
                raise ConfigError(
                    f"jobs.{job.name}.sweep with backend=batch: this release runs a sweep as an "
                    "AzureML sweep job, whose trials AzureML samples and stops early; set backend "
                    "azureml, or run the trials as jobs of their own"
                )
        return
    if acceptance_profile:
        raise ConfigError(
            f"backend=azureml with acceptanceProfile={acceptance_profile}: the acceptance check "
            "runs its job on a Batch pool; set backend batch for an acceptance stack"
        )
    for job in jobs:
        if job.priority:
            raise ConfigError(
                f"jobs.{job.name}.priority={job.priority} with backend=azureml: an AzureML "
                "compute cluster runs its jobs in the order they come, with no priority; remove "
                "it or set backend batch"
            )
