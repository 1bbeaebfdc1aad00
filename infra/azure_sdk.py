"""The deployer's own Azure SDK packages (Batch's data plane, ARM's pipeline, the registry's
management client), imported through this module alone and lazily, as
``trainer.common.azure_sdk`` does for the packages both sides use (azure-core's errors, Entra
credentials, Blob storage): a name is imported from its SDK module when it is first asked for,
inside a function, so Pulumi's provider host, dry runs and the commands load only what they
call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.common.azure_sdk import lazy_names

# The names of HOMES, for type checkers (tests/infra/test_azure_sdk.py holds the two equal);
# a name renamed on the way out is re-exported all the same (hence its F401 waiver).
if TYPE_CHECKING:
    from azure.batch import BatchClient as BatchClient
    from azure.batch import _configuration as batch_configuration  # noqa: F401
    from azure.batch import models as batch_models  # noqa: F401
    from azure.batch.models._models import BatchJobTerminateOptions as BatchJobTerminateOptions
    from azure.core.pipeline import policies as core_policies  # noqa: F401
    from azure.core.polling import LROPoller as LROPoller
    from azure.core.rest import HttpRequest as HttpRequest
    from azure.mgmt.containerregistry import (
        ContainerRegistryManagementClient as ContainerRegistryManagementClient,
    )
    from azure.mgmt.containerregistry.v2025_03_01_preview.models import (
        TaskRunRequest as TaskRunRequest,
    )
    from azure.mgmt.core import ARMPipelineClient as ARMPipelineClient
    from azure.mgmt.core.exceptions import ARMErrorFormat as ARMErrorFormat
    from azure.mgmt.core.policies import (
        ARMChallengeAuthenticationPolicy as ARMChallengeAuthenticationPolicy,
    )
    from azure.mgmt.core.policies import ARMHttpLoggingPolicy as ARMHttpLoggingPolicy
    from azure.mgmt.core.polling.arm_polling import ARMPolling as ARMPolling

# Each SDK module, and the names this module takes from it ("name as alias" where the SDK's
# name would not say which SDK it is of).
HOMES: dict[str, tuple[str, ...]] = {
    # batch_configuration: the module that states the API version the SDK sends
    # (infra.api_versions); BatchJobTerminateOptions is not exported by azure.batch.models.
    "azure.batch": (
        "BatchClient",
        "_configuration as batch_configuration",
        "models as batch_models",
    ),
    "azure.batch.models._models": ("BatchJobTerminateOptions",),
    "azure.core.pipeline": ("policies as core_policies",),
    "azure.core.polling": ("LROPoller",),
    "azure.core.rest": ("HttpRequest",),
    "azure.mgmt.containerregistry": ("ContainerRegistryManagementClient",),
    "azure.mgmt.containerregistry.v2025_03_01_preview.models": ("TaskRunRequest",),
    "azure.mgmt.core": ("ARMPipelineClient",),
    "azure.mgmt.core.exceptions": ("ARMErrorFormat",),
    "azure.mgmt.core.policies": ("ARMChallengeAuthenticationPolicy", "ARMHttpLoggingPolicy"),
    "azure.mgmt.core.polling.arm_polling": ("ARMPolling",),
}

__getattr__ = lazy_names(__name__, HOMES)
