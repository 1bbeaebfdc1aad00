"""The rendezvous token through Blob, for nodes that share no folder (an AzureML job): the master
writes this launch's token to ``<folder>/rendezvous.token`` with the nodes' identity, and the
other nodes read it there, as Batch's nodes read theirs from the run folder on the share
(``trainer.launch.rendezvous.publish_token``). The folder is the job's own, in the logs
container: only the job's identity writes it, and only those who may read the job's logs (its
nodes and its operators) read it. A token left there by an earlier launch is refused by the
master's store, and the nodes read again until the master's new one answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.common.blob_client import container_client
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.grant_wait import (
    CONTRIBUTOR,
    GRANT_WAIT_MINUTES,
    PENDING,
    GrantMissing,
    GrantWait,
)
from trainer.launch.batch_env import LaunchError

TOKEN_BLOB = "rendezvous.token"


class BlobToken:
    """This job's token blob in ``folder``."""

    def __init__(self, folder: BlobFolder) -> None:
        self.folder = folder
        self.url = folder.url + TOKEN_BLOB
        self._container: Any = None

    def _client(self) -> Any:
        if self._container is None:
            self._container = container_client(self.folder)
        return self._container

    def publish(self, token: str, say: Callable[[str], None]) -> None:
        """Write ``token`` (the master), once the nodes' new role has reached Storage (a wait of
        up to GRANT_WAIT_MINUTES, said in ``say``); LaunchError when it cannot."""
        blob = self.folder.blob(TOKEN_BLOB)
        put = lambda: self._client().upload_blob(blob, token.encode(), overwrite=True)  # noqa: E731
        try:
            GrantWait(CONTRIBUTOR, log=say).call(put, f"handing the token to {self.url}")
        except GrantMissing:
            raise LaunchError(
                f"cannot hand the rendezvous token to the other nodes at {self.url}: Storage "
                f"still refuses the nodes' identity ({PENDING}) after {GRANT_WAIT_MINUTES:g} min; "
                f"it needs {CONTRIBUTOR} on the logs container"
            ) from None
        except Exception as err:  # the SDK's errors, whatever their class: one line
            raise LaunchError(
                f"cannot hand the rendezvous token to the other nodes at {self.url}: "
                f"{first_line(err)}"
            ) from None

    def read_token(self) -> str | None:
        """The token the master published, None until it did (or while it cannot be read:
        the caller keeps asking until its own deadline)."""
        try:
            data = self._client().download_blob(self.folder.blob(TOKEN_BLOB)).readall()
        except Exception:  # absent yet, a role still arriving, a network blip: ask again
            return None
        return data.decode("ascii", errors="replace").strip() or None
