"""The Azure SDK packages both sides use (azure-core's errors, Entra credentials, Blob
storage), imported through this module alone, and lazily: a name is imported from its SDK
module when it is first asked for (``from trainer.common.azure_sdk import ContainerClient``
inside a function), so importing the trainer, the program or the commands loads no SDK (the
trainer's command line and Pulumi's provider host stay light). The deployer's own packages
(Batch, ARM, the registry's) are ``infra.azure_sdk``'s."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names of HOMES, for type checkers (tests/infra/test_azure_sdk.py)
    from azure.core.exceptions import AzureError as AzureError
    from azure.core.exceptions import ClientAuthenticationError as ClientAuthenticationError
    from azure.core.exceptions import HttpResponseError as HttpResponseError
    from azure.core.exceptions import ResourceExistsError as ResourceExistsError
    from azure.core.exceptions import ResourceNotFoundError as ResourceNotFoundError
    from azure.core.exceptions import ServiceRequestError as ServiceRequestError
    from azure.core.exceptions import ServiceResponseError as ServiceResponseError
    from azure.identity import ClientAssertionCredential as ClientAssertionCredential
    from azure.identity import DefaultAzureCredential as DefaultAzureCredential
    from azure.storage.blob import BlobClient as BlobClient
    from azure.storage.blob import ContainerClient as ContainerClient
    from azure.storage.blob import ExponentialRetry as ExponentialRetry
    from azure.storage.blob import LinearRetry as LinearRetry

# Each SDK module, and the names this module takes from it ("name as alias" where the SDK's name
# would not say which SDK it is of).
HOMES: dict[str, tuple[str, ...]] = {
    "azure.core.exceptions": (
        "AzureError",
        "ClientAuthenticationError",
        "HttpResponseError",
        "ResourceExistsError",
        "ResourceNotFoundError",
        "ServiceRequestError",
        "ServiceResponseError",
    ),
    "azure.identity": ("ClientAssertionCredential", "DefaultAzureCredential"),
    "azure.storage.blob": ("BlobClient", "ContainerClient", "ExponentialRetry", "LinearRetry"),
}


def lazy_names(module: str, homes: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (PEP 562) that imports each name of ``homes`` from its SDK
    module when it is first asked for, as ``from <home> import <name>`` would (a submodule
    included)."""
    where: dict[str, tuple[str, str]] = {}
    for home, entries in homes.items():
        for entry in entries:
            name, _, alias = entry.partition(" as ")
            where[alias or name] = (home, name)

    def __getattr__(attribute: str) -> Any:
        if attribute not in where:
            raise AttributeError(f"module {module!r} has no attribute {attribute!r}")
        home, name = where[attribute]
        found = importlib.import_module(home)
        if hasattr(found, name):
            return getattr(found, name)
        return importlib.import_module(f"{home}.{name}")

    return __getattr__


__getattr__ = lazy_names(__name__, HOMES)
