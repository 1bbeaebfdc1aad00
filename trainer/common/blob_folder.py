"""A "folder" in Blob storage named by one URL,
``https://<account>.blob.core.windows.net/<container>/<prefix>/``.

The trainer's live upload writes there and the operator CLI reads there; both split the URL the
same way. Pure: no Azure SDK import, so the trainer's config validation can use it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

# Azure container names: 3-63 lowercase letters, digits and single hyphens, starting and ending
# with a letter or digit.
_CONTAINER = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
EXAMPLE = "https://<account>.blob.core.windows.net/logs/<job-id>/live/"


@dataclass(frozen=True)
class BlobFolder:
    account_url: str  # https://<account>.blob.core.windows.net (or https://<ip>:<port>/<account>)
    container: str
    prefix: str  # "" or ending in "/"

    @property
    def url(self) -> str:
        return f"{self.account_url}/{self.container}/{self.prefix}"

    def blob(self, name: str) -> str:
        """The blob name of ``name`` (a path relative to the folder, with ``/``)."""
        return self.prefix + name

    @classmethod
    def parse(cls, url: str) -> BlobFolder:
        """Split a folder URL; raises ValueError with a one-line reason (no setting name)."""
        if not isinstance(url, str) or not url.lower().startswith("https://"):
            raise ValueError(f"must be an https:// blob folder URL like {EXAMPLE}")
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
            _ = parts.port  # raises ValueError on a port that is not a number
        except ValueError:
            raise ValueError(f"not a URL; give one like {EXAMPLE}") from None
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(
                "must carry no query, fragment or user (no SAS token: the identity "
                "of the machine or the Azure CLI login authenticates)"
            )
        segments = [unquote(s) for s in parts.path.split("/") if s]
        account_path = ""
        # As the SDK's own BlobClient.from_blob_url: an IP address or localhost (the emulator,
        # Azure Stack) puts the account in the path; <account>.blob.<suffix> puts it in the host.
        if _is_ip(host) or host == "localhost":
            if not segments:
                raise ValueError(f"names no account: give {EXAMPLE} (path-style: /<account>/...)")
            account_path = "/" + segments.pop(0)
        if not host or not segments:
            raise ValueError(f"names no container: give one like {EXAMPLE}")
        container, rest = segments[0], segments[1:]
        if not _CONTAINER.match(container):
            raise ValueError(
                f"container {container!r} is not a valid container name (3-63 lowercase "
                "letters, digits and hyphens)"
            )
        if any(s in (".", "..") for s in rest):
            raise ValueError("must not contain . or .. segments")
        prefix = "".join(f"{s}/" for s in rest)
        return cls(f"https://{parts.netloc}{account_path}", container, prefix)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
