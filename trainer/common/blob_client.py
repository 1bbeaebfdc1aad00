"""The Blob client rank 0 writes with (the live upload, the results, the checkpoint mirror, the
weights an ``--init-from`` reads): the machine's identity, quick retries, the SDK's logging
quiet."""

from __future__ import annotations

import logging
from typing import Any

from trainer.common.blob_folder import BlobFolder

# A failed request is tried twice more, 2 s apart, then the period ends; the next one retries.
# (The SDK's default waits 15 s and more between tries, which would hold up the end of a run.)
RETRIES, RETRY_BACKOFF_SECONDS = 2, 2


def container_client(folder: BlobFolder) -> Any:
    """A client of ``folder``'s container as rank 0 writes there."""
    from trainer.common.azure_sdk import ContainerClient, DefaultAzureCredential, LinearRetry

    # The SDK logs every request at INFO and a failed credential chain as a multi-line
    # WARNING; the callers report each failure in one line of their own.
    logging.getLogger("azure").setLevel(logging.ERROR)
    return ContainerClient(
        folder.account_url,
        folder.container,
        credential=DefaultAzureCredential(),
        retry_policy=LinearRetry(
            backoff=RETRY_BACKOFF_SECONDS, retry_total=RETRIES, random_jitter_range=1
        ),
    )
