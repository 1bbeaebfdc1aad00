"""The AzureML section: where the stack's jobs run (``backend``: its Azure Batch pool, or an
AzureML compute cluster, ``infra.azureml_compute``), and whether it declares an Azure Machine
Learning workspace (``infra.workspace``) for its runs and registered models, which the AzureML
backend always does. The jobs against the backend are a rule across sections
(``infra.settings.rules.check_backend``)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings.checks import ConfigError
from infra.settings.schema import setting

BACKENDS = ("batch", "azureml")


@dataclass(frozen=True, kw_only=True)
class AzuremlSettings:
    """Where the jobs run, and the stack's AzureML workspace; ``workspace`` false with the Batch
    backend declares none."""

    backend: str = setting(
        "backend",
        "batch",
        "Where the stack's nodes run: batch (an Azure Batch pool, the NFS server beside it), or "
        "azureml (an AzureML workspace with a compute cluster of vmSize in the compute subnet: "
        "no public IPs, scaled to zero when idle, up to nodeCount nodes; the trainer image as "
        "its environment; no Batch account, pool or NFS server). A change replaces the stack's "
        "compute.",
    )
    workspace: bool = setting(
        "azuremlWorkspace",
        False,
        "Declare an AzureML workspace (its runs, metrics and registered models) on the stack's "
        "storage and registry, with a key vault of its own, reached only through a private "
        "endpoint in the compute subnet (public network access off, as the rest of the stack); "
        "the nodes' identity may write runs and models there (MLflow's actions, no more). Its "
        "MLflow tracking URI and studio URL are stack outputs. With protectData the workspace "
        "and its vault survive `pulumi destroy`. backend azureml declares it whatever this says.",
    )

    @property
    def on_azureml(self) -> bool:
        """Whether the nodes are an AzureML compute cluster (no Batch pool)."""
        return self.backend == "azureml"

    @property
    def declares_workspace(self) -> bool:
        """Whether the stack has a workspace: asked for, or the one its compute lives in."""
        return self.workspace or self.on_azureml

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: use {' or '.join(BACKENDS)}")
