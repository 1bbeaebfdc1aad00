"""A stack job on the AzureML backend, as a native command job (``ml.Job``): the job's command
(infra.azureml_command) on the stack's compute, in the trainer's environment, one process per
node (AzureML's PyTorch distribution: the launcher starts the node's workers), with the nodes'
identity and the job's experiment; its name renewed by any change (AzureML never changes a job),
behind its guard (infra.azureml_job_guard); its id, state, studio link and Blob folders as
outputs. ``pulumi preview`` diffs it as the ARM resource it is.

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/):
how-to-train-distributed-gpu.md (PyTorch distribution, process_count_per_instance),
reference-yaml-job-command.md (limits.timeout: the job is cancelled after it; experiment_name),
how-to-identity-based-service-authentication.md (identity: managed, the compute's identity)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_azure_native import machinelearningservices as ml

from infra.azureml_command import (
    AzuremlJobSpec,
    environment_variables,
    job_command,
    shm_size,
    trial_command,
)
from infra.azureml_job_guard import AzuremlJobGuard, job_arm_id
from infra.naming import Placement
from infra.settings.sweep import SweepSettings
from trainer.outputs.tracking import STUDIO

# One job's stack outputs on AzureML (beside each: the attribute of ``AzuremlJob`` it carries).
AZUREML_JOB_OUTPUTS = {
    "job_id": "job_id",
    "job_state": "state",
    "job_studio_url": "studio_url",
    "job_log_url": "log_url",
    "metrics_url": "metrics_url",
    "outputs_url": "outputs_url",
    "checkpoint_mirror_url": "checkpoint_mirror_url",
    "experiment": "experiment",
}


@dataclass(frozen=True)
class AzuremlJobArgs:
    placement: Placement
    workspace_name: pulumi.Input[str]
    workspace_id: pulumi.Input[str]
    tenant_id: pulumi.Input[str]
    compute_id: pulumi.Input[str]
    environment_id: pulumi.Input[str]
    node_identity_id: pulumi.Input[str]
    # The job's fields, their Azure ones still Outputs: made into a spec once they are known.
    spec: pulumi.Output[AzuremlJobSpec]
    label: str  # the job's name in the stack's jobs map
    protect_running: bool
    after: Sequence[pulumi.Resource]
    sweep: SweepSettings | None = None  # a sweep job of trials, rather than one command job


def timeout(hours: int) -> str | None:
    """jobs.<name>.maxWallClockHours as AzureML's timeout (ISO 8601); none for 0."""
    return f"PT{hours}H" if hours else None


def limits(hours: int) -> ml.CommandJobLimitsArgs | None:
    """A command job's limits: its timeout, after which AzureML cancels it."""
    return (
        ml.CommandJobLimitsArgs(job_limits_type="Command", timeout=timeout(hours))
        if hours
        else None
    )


def _tags(spec: AzuremlJobSpec, label: str) -> dict[str, str]:
    """What the job is, for the studio and the preview's jobs summary (tags change in place)."""
    return {"stack": spec.stack, "job": label, "run": spec.run_name}


def _snake(name: str) -> str:
    """An ARM field's name (camelCase) as azure-native's argument (snake_case)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _resources(spec: pulumi.Output[AzuremlJobSpec]) -> ml.JobResourceConfigurationArgs:
    """The job's nodes, each container's /dev/shm as Batch's have it."""
    return ml.JobResourceConfigurationArgs(
        instance_count=spec.apply(lambda s: s.node_count),
        shm_size=spec.apply(lambda s: shm_size(s.vm_size)),
    )


def job_state(properties: Any) -> str:
    """The job's status as the last create or refresh read it."""
    status = (
        properties.get("status")
        if isinstance(properties, dict)
        else getattr(properties, "status", None)
    )
    return str(status or "NotStarted")


class AzuremlJob(pulumi.ComponentResource):
    job_id: pulumi.Output[str]
    state: pulumi.Output[str]
    studio_url: pulumi.Output[str]
    log_url: pulumi.Output[str]
    metrics_url: pulumi.Output[str]
    outputs_url: pulumi.Output[str]
    checkpoint_mirror_url: pulumi.Output[str]
    experiment: pulumi.Output[str]

    def __init__(
        self, name: str, args: AzuremlJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:AzuremlJob", name, None, opts)
        spec = args.spec
        self.job_id = spec.apply(lambda s: s.job_id)
        guard = AzuremlJobGuard(
            f"{name}-guard",
            pulumi.Output.all(args.workspace_id, self.job_id).apply(lambda a: job_arm_id(*a)),
            args.label,
            args.protect_running,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
        )
        job = ml.Job(
            f"{name}-aml",
            id=self.job_id,
            workspace_name=args.workspace_name,
            resource_group_name=args.placement.resource_group_name,
            properties=self._sweep_job(args, args.sweep) if args.sweep else self._command_job(args),
            # The guard cancels a job before its replacement starts; the record stays.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[guard], retain_on_delete=True),
        )
        self.state = job.properties.apply(job_state)
        self.studio_url = pulumi.Output.concat(
            f"{STUDIO}/runs/", self.job_id, "?wsid=", args.workspace_id, "&tid=", args.tenant_id
        )
        self.log_url = spec.apply(lambda s: s.log_url)
        self.metrics_url = spec.apply(lambda s: s.metrics_url)
        self.outputs_url = spec.apply(lambda s: s.outputs_url)
        self.checkpoint_mirror_url = spec.apply(lambda s: s.checkpoint_mirror_url)
        self.experiment = spec.apply(lambda s: s.experiment)
        self.register_outputs({"job_id": self.job_id})

    @staticmethod
    def _sweep_job(args: AzuremlJobArgs, sweep: SweepSettings) -> ml.SweepJobArgs:
        """Trials of the job's command, each with the values AzureML samples from the space,
        judged by the objective the trainer logs, stopped early by the policy."""
        spec = args.spec
        stop = dict(sweep.stop)
        policy = {
            "Bandit": ml.BanditPolicyArgs,
            "MedianStopping": ml.MedianStoppingPolicyArgs,
            "TruncationSelection": ml.TruncationSelectionPolicyArgs,
        }.get(str(stop.get("policyType")))
        sampling = {
            "random": ml.RandomSamplingAlgorithmArgs(sampling_algorithm_type="Random"),
            "grid": ml.GridSamplingAlgorithmArgs(sampling_algorithm_type="Grid"),
            "bayesian": ml.BayesianSamplingAlgorithmArgs(sampling_algorithm_type="Bayesian"),
        }[sweep.sampling]
        return ml.SweepJobArgs(
            job_type="Sweep",
            objective=ml.ObjectiveArgs(
                goal=sweep.goal.capitalize(), primary_metric=sweep.objective
            ),
            sampling_algorithm=sampling,
            search_space=sweep.search_space(),
            early_termination=policy(**{_snake(k): v for k, v in stop.items()}) if policy else None,
            limits=ml.SweepJobLimitsArgs(
                job_limits_type="Sweep",
                max_total_trials=sweep.trials,
                max_concurrent_trials=sweep.concurrent_trials,
                timeout=spec.apply(lambda s: timeout(s.max_wall_clock_hours)),
            ),
            trial=ml.TrialComponentArgs(
                command=spec.apply(lambda s: trial_command(s, sweep.swept)),
                environment_id=args.environment_id,
                distribution=ml.PyTorchArgs(
                    distribution_type="PyTorch", process_count_per_instance=1
                ),
                resources=_resources(spec),
                environment_variables=spec.apply(environment_variables),
            ),
            compute_id=args.compute_id,
            display_name=spec.apply(lambda s: f"{s.stack} {s.name or 'training'} sweep"),
            experiment_name=spec.apply(lambda s: s.experiment),
            description=spec.apply(
                lambda s: f"{sweep.trials} trials of {s.node_count} x {s.vm_size}"
            ),
            identity=ml.ManagedIdentityArgs(
                identity_type="Managed", resource_id=args.node_identity_id
            ),
            tags=spec.apply(lambda s: _tags(s, args.label)),
        )

    @staticmethod
    def _command_job(args: AzuremlJobArgs) -> ml.CommandJobArgs:
        spec = args.spec
        return ml.CommandJobArgs(
            job_type="Command",
            command=spec.apply(job_command),
            environment_id=args.environment_id,
            compute_id=args.compute_id,
            display_name=spec.apply(lambda s: f"{s.stack} {s.name or 'training'}"),
            experiment_name=spec.apply(lambda s: s.experiment),
            description=spec.apply(lambda s: f"{s.node_count} x {s.vm_size}, run {s.run_name}"),
            distribution=ml.PyTorchArgs(distribution_type="PyTorch", process_count_per_instance=1),
            resources=_resources(spec),
            identity=ml.ManagedIdentityArgs(
                identity_type="Managed", resource_id=args.node_identity_id
            ),
            environment_variables=spec.apply(environment_variables),
            limits=spec.apply(lambda s: limits(s.max_wall_clock_hours)),
            tags=spec.apply(lambda s: _tags(s, args.label)),
        )
