"""The one Azure credential of a process that deploys or operates a stack: the job, image and
registry providers in Pulumi's provider host, and the operator commands.

Under GitHub Actions with OIDC (the deploy workflow), ``azure/login`` runs ``az login
--federated-token`` with a GitHub ID token that Entra accepts for five minutes, and ``az``
cannot fetch another (Azure/azure-cli #28708, PR #33989; Azure/login #180, #372). Every token
``az`` must get after that fails with AADSTS700024: the first Batch token of a new stack, the
ARM token a long image build's poll needs. So there the credential asks GitHub for a fresh ID
token each time it needs an Entra token. Everywhere else it is ``DefaultAzureCredential``.

Azure SDK imports stay inside functions: the provider host imports this module on every call.
"""

from __future__ import annotations

import functools
import json
import os
import urllib.parse
import urllib.request
from typing import Any

# The audience Entra's federated credentials expect of a GitHub ID token (Entra's workload
# identity federation docs; GitHub's "Configuring OpenID Connect in Azure").
GITHUB_AUDIENCE = "api://AzureADTokenExchange"
# Set by the runner in every step of a job with `permissions: id-token: write`.
GITHUB_REQUEST_URL = "ACTIONS_ID_TOKEN_REQUEST_URL"
GITHUB_REQUEST_TOKEN = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"
# The deploy's identity, as the workflow gives it to the azure-native provider (ARM_*) or to
# azure-identity (AZURE_*).
CLIENT_ID_VARIABLES = ("AZURE_CLIENT_ID", "ARM_CLIENT_ID")
TENANT_ID_VARIABLES = ("AZURE_TENANT_ID", "ARM_TENANT_ID")
ID_TOKEN_TIMEOUT_SECONDS = 30


def _first(names: tuple[str, ...]) -> str:
    return next((os.environ[n] for n in names if os.environ.get(n)), "")


def github_id_token() -> str:
    """A fresh GitHub ID token for Entra, as the runner's token endpoint issues it."""
    url = os.environ[GITHUB_REQUEST_URL]
    separator = "&" if urllib.parse.urlsplit(url).query else "?"
    audience = urllib.parse.urlencode({"audience": GITHUB_AUDIENCE})
    request = urllib.request.Request(
        f"{url}{separator}{audience}",
        headers={"Authorization": f"bearer {os.environ[GITHUB_REQUEST_TOKEN]}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=ID_TOKEN_TIMEOUT_SECONDS) as response:
            return json.loads(response.read())["value"]
    except (OSError, ValueError, KeyError) as err:
        from trainer.common.azure_sdk import ClientAuthenticationError

        # An Azure authentication error, which every caller already reports in one line.
        raise ClientAuthenticationError(
            f"GitHub gave no ID token for Azure ({err}); the workflow job needs "
            "`permissions: id-token: write`"
        ) from None


def under_github_oidc() -> bool:
    """True in a GitHub Actions step that may ask for ID tokens and names an identity."""
    return all(
        (
            os.environ.get(GITHUB_REQUEST_URL),
            os.environ.get(GITHUB_REQUEST_TOKEN),
            _first(CLIENT_ID_VARIABLES),
            _first(TENANT_ID_VARIABLES),
        )
    )


@functools.cache
def credential() -> Any:
    """One credential per process: each new ``DefaultAzureCredential`` probes its whole chain
    again, and the provider host serves every operation of a deployment."""
    if under_github_oidc():
        from trainer.common.azure_sdk import ClientAssertionCredential

        # The function runs each time the credential needs a new Entra token.
        return ClientAssertionCredential(
            _first(TENANT_ID_VARIABLES), _first(CLIENT_ID_VARIABLES), func=github_id_token
        )
    from trainer.common.azure_sdk import DefaultAzureCredential

    return DefaultAzureCredential()
