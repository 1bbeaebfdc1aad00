"""The AzureML section: whether the stack declares an Azure Machine Learning workspace beside
its Batch pool (``infra.workspace``), for its runs and registered models. A boolean has nothing
to check of its own, so the section has no ``check()``."""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings.schema import setting


@dataclass(frozen=True, kw_only=True)
class AzuremlSettings:
    """The stack's AzureML workspace; ``workspace`` false declares none."""

    workspace: bool = setting(
        "azuremlWorkspace",
        False,
        "Declare an AzureML workspace (its runs, metrics and registered models) on the stack's "
        "storage and registry, with a key vault of its own, reached only through a private "
        "endpoint in the compute subnet (public network access off, as the rest of the stack); "
        "the nodes' identity may write runs and models there (MLflow's actions, no more). Its "
        "MLflow "
        "tracking URI and studio URL are stack outputs. With protectData the workspace and its "
        "vault survive `pulumi destroy`.",
    )
