"""Role assignments that arrive late: an HTTPS proxy in front of Azurite that answers every
request made with a managed identity's bearer token ``403 AuthorizationPermissionMismatch`` until
the grant time the test set for that identity, as Storage does while a new role assignment
propagates. Azurite with ``--oauth basic`` accepts any well-formed token: it has no RBAC.

What Azure documents:
- "Azure role assignments may take up to 30 minutes to propagate"
  (azure-docs articles/storage/blobs/authorize-access-azure-active-directory.md, "Assign Azure
  roles for access rights"); until then the identity holds no data role on the account.
- A principal without the data role gets 403 ``AuthorizationPermissionMismatch``, "This request
  is not authorized to perform this operation using this permission." (the Storage error code
  tables; Azurite's own StorageErrorFactory sends the same code and message), in the error body
  of the Storage REST API: ``<?xml ...?><Error><Code>..</Code><Message>..</Message></Error>``,
  the code repeated in ``x-ms-error-code`` (Storage REST docs, "Status and error codes").

What it leaves open, and the reading taken here (the unfavourable one): whether every front end
sees the new assignment at the same moment. Here a grant may be *unsettled* for a while after its
time: requests then alternate between denied and allowed, so a client that got its first answer
may still be refused on the next one (a staged manifest, then a 403 on a shard).

Per container and per role: a grant is scoped to the account or to one container
(``<account id>/blobServices/default/containers/<name>``, "Scope a role assignment to a
container" in azure-docs articles/storage/blobs/assign-azure-role-data-access.md; the scope
contains everything under it), and Storage Blob Data Reader allows only reading and listing
blobs, Contributor also writing and deleting them (articles/role-based-access-control/
built-in-roles: Reader's data actions are ``containers/blobs/read`` alone). A request outside
every grant of its identity gets the same 403 as one before its grant. A container grant covers
nothing at the account's own level (listing containers), the unfavourable reading.

Control-plane roles give no data access: Owner, Contributor and Storage Account Contributor
"don't grant access to blob data through Microsoft Entra ID" (azure-docs articles/storage/blobs/
authorize-access-azure-active-directory.md, read 2026-11-28): a grant of one covers nothing here.

The account's network rules come first (``NetworkRules``): with ``defaultAction: Deny`` a
request from an address outside its IP rules and not from an allowed subnet gets 403
``AuthorizationFailure``, "This request is not authorized to perform this operation.", whatever
its credential (SupportArticles-docs storage-troubleshoot-403-errors.md, "IP address
restrictions"; the wire message quoted in microsoft/AzureStorageExplorer #9150; read
2026-11-28), not the missing role's ``AuthorizationPermissionMismatch``.

Requests signed with the account key (the tests' own setup and checks) pass: Shared Key is not
subject to Azure RBAC. The proxy forwards everything else to Azurite unchanged."""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.replies import send_body

MISMATCH = "AuthorizationPermissionMismatch"
MISMATCH_MESSAGE = "This request is not authorized to perform this operation using this permission."
FIREWALL = "AuthorizationFailure"
FIREWALL_MESSAGE = "This request is not authorized to perform this operation."
# Hop-by-hop headers (RFC 9110 section 7.6.1): never forwarded by a proxy.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class FakeClock:
    """A clock that moves only when told: the code under test sleeps with ``advance``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


READER = "Storage Blob Data Reader"
CONTRIBUTOR = "Storage Blob Data Contributor"
# What each role may do: Reader's only data action reads (GET, HEAD: download, properties,
# list); Contributor's also write and delete (PUT, POST, PATCH, DELETE). The control-plane
# roles hold no data action at all.
_READS = frozenset({"GET", "HEAD"})
ROLE_METHODS = {
    READER: _READS,
    CONTRIBUTOR: _READS | {"PUT", "POST", "PATCH", "DELETE"},
    "Owner": frozenset(),
    "Contributor": frozenset(),
    "Storage Account Contributor": frozenset(),
}


@dataclass
class NetworkRules:
    """The account's firewall as the proxy's callers meet it: ``caller`` is where Azure sees
    this machine's requests come from, a public address (a laptop, a CI runner) or
    ``SUBNET`` (a node in an allowed subnet, through its service endpoint); a test moves it."""

    default_action: str = "Deny"
    ip_rules: tuple[str, ...] = ()
    caller: str = "198.51.100.7"
    refused: list[tuple[str, str]] = field(default_factory=list)  # (caller, path)

    def admits(self, path: str) -> bool:
        import ipaddress

        if self.default_action == "Allow" or self.caller == SUBNET:
            return True
        address = ipaddress.ip_address(self.caller)
        if any(address in ipaddress.ip_network(rule, strict=False) for rule in self.ip_rules):
            return True
        self.refused.append((self.caller, path))
        return False


SUBNET = "subnet"  # NetworkRules.caller for a request through an allowed subnet


@dataclass
class Grant:
    at: float  # from this time on the role assignment has reached Storage
    unsettled_s: float = 0.0  # then, for this long, every other request is still refused
    seen: int = 0  # requests answered after ``at`` (the alternation's counter)
    role: str = CONTRIBUTOR
    container: str | None = None  # None: the whole account

    def covers(self, method: str, container: str | None) -> bool:
        in_scope = self.container is None or self.container == container
        return in_scope and method in ROLE_METHODS[self.role]


def request_container(path: str) -> str | None:
    """The container a request path (``/<account>/<container>/<blob>?...``) names, if any."""
    segments = urlsplit(path).path.split("/")
    return segments[2] if len(segments) > 2 and segments[2] else None


@dataclass
class Grants:
    """The role assignments of each identity (the token's ``oid``): none until ``grant``."""

    clock: Callable[[], float] = time.monotonic
    # None: every caller stands where the account's network admits it (a node in its subnet).
    network: NetworkRules | None = None
    # Group -> its members: a role assigned to a group is held by each member.
    members: dict[str, set[str]] = field(default_factory=dict)
    _grants: dict[str, list[Grant]] = field(default_factory=dict)
    denied: list[tuple[str, str, str]] = field(default_factory=list)  # (identity, method, path)
    allowed: int = 0
    refused: threading.Event = field(default_factory=threading.Event)  # set at the first 403
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(
        self,
        identity: str,
        after_s: float = 0.0,
        unsettled_s: float = 0.0,
        *,
        role: str = CONTRIBUTOR,
        container: str | None = None,
    ) -> None:
        """The identity's ``role`` on ``container`` (None: the account) reaches Storage
        ``after_s`` from now; its other grants stay."""
        with self._lock:
            grant = Grant(self.clock() + after_s, unsettled_s, role=role, container=container)
            self._grants.setdefault(identity, []).append(grant)

    def revoke(self, identity: str) -> None:
        with self._lock:
            self._grants.pop(identity, None)

    def permits(self, identity: str, method: str, path: str) -> bool:
        container = request_container(path)
        with self._lock:
            now = self.clock()
            holders = [identity, *(g for g, m in self.members.items() if identity in m)]
            covering = [
                g
                for holder in holders
                for g in self._grants.get(holder, [])
                if g.covers(method, container) and now >= g.at
            ]
            ok = any(now >= g.at + g.unsettled_s for g in covering)
            for grant in [] if ok else covering:  # unsettled: the first request is refused
                grant.seen += 1
                ok = ok or grant.seen % 2 == 0
            if ok:
                self.allowed += 1
            else:
                self.denied.append((identity, method, path))
                self.refused.set()
            return ok


def token_identity(authorization: str) -> str | None:
    """The ``oid`` claim of a bearer token (unverified: Azurite checks the token itself)."""
    kind, _, token = authorization.partition(" ")
    if kind.lower() != "bearer" or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims.get("oid") if isinstance(claims, dict) else None


def error_body(code: str, message: str, request_id: str) -> bytes:
    """The Storage error document Storage sends with a 403."""
    time_text = time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())
    return (
        '<?xml version="1.0" encoding="utf-8"?><Error>'
        f"<Code>{code}</Code>"
        f"<Message>{message}\nRequestId:{request_id}\nTime:{time_text}</Message>"
        "</Error>"
    ).encode()


class GrantProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, upstream_ca: Path, grants: Grants) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "", parts.port or 443
        self.upstream_context = ssl.create_default_context(cafile=str(upstream_ca))
        self.grants = grants


class _Handler(BaseHTTPRequestHandler):
    server: GrantProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects

    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        identity = token_identity(self.headers.get("Authorization", ""))
        network = self.server.grants.network
        if identity is not None and network is not None and not network.admits(self.path):
            self._deny(FIREWALL, FIREWALL_MESSAGE)
            return
        if identity is not None and not self.server.grants.permits(
            identity, self.command, self.path
        ):
            self._deny(MISMATCH, MISMATCH_MESSAGE)
            return
        self._forward(body)

    def _deny(self, code: str, message: str) -> None:
        request_id = str(uuid.uuid4())
        body = b"" if self.command == "HEAD" else error_body(code, message, request_id)
        headers = {
            "Content-Type": "application/xml",
            "x-ms-error-code": code,
            "x-ms-request-id": request_id,
            "x-ms-version": self.headers.get("x-ms-version", "2021-12-02"),
            "Date": formatdate(usegmt=True),
        }
        send_body(self, 403, body, headers, reason=message)

    def _forward(self, body: bytes) -> None:
        upstream = http.client.HTTPSConnection(
            self.server.upstream_host,
            self.server.upstream_port,
            context=self.server.upstream_context,
            timeout=60,
        )
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle


@contextmanager
def grant_proxy(
    upstream: str, upstream_ca: Path, grants: Grants, folder: Path
) -> Iterator[tuple[str, Path]]:
    """The proxy over TLS in a daemon thread; yields its ``https://127.0.0.1:<port>`` address
    and the certificate (written to ``folder``) its clients must trust."""
    from tests.support.tls import serve_tls

    server = GrantProxy(upstream, upstream_ca, grants)
    cert = serve_tls(server, folder, name="grants")
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
