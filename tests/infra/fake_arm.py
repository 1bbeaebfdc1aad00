"""A fake Azure Resource Manager on 127.0.0.1 over TLS for the tests of the dynamic providers
that call ARM themselves (the image build, the registry's task bypass): the real azure-mgmt and
azure-core clients talk to it with a fake Entra token, trusting only its certificate."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.replies import send_json
from tests.support.tls import serve_https

# (method, path, query, headers, body) -> (status, response headers, JSON body or None)
# A status of DROP closes the connection without an answer (a connection reset mid-request).
DROP = -1
Handle = Callable[
    [str, str, dict[str, list[str]], dict[str, str], Any], tuple[int, dict[str, str], Any]
]


def start_arm(folder: Path, handle: Handle) -> tuple[ThreadingHTTPServer, Path]:
    """Serve ``handle`` as ARM over TLS on 127.0.0.1; returns the server (``shutdown()`` it)
    and the certificate a client must trust."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, headers, answer = handle(
                self.command, url.path, urllib.parse.parse_qs(url.query), dict(self.headers), body
            )
            if status == DROP:
                self.close_connection = True
                return
            send_json(self, status, answer, headers)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, *args: object) -> None:
            pass

    return serve_https(Handler, folder, "fake-arm")


@contextmanager
def serving_arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle) -> Iterator[str]:
    """Serve ``handle`` as ARM; yields its base URL. The process's one credential
    (``infra.credentials``) gives a token for ARM's scope only, and no proxy stands between the
    client and the fake."""
    from azure.core.credentials import AccessToken

    from infra import credentials

    class FakeCredential:
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            assert scopes == ("https://management.azure.com/.default",)
            return AccessToken("fake-arm-token", 4102444800)

    server, cert_file = start_arm(tmp_path, handle)
    monkeypatch.setattr(credentials, "credential", FakeCredential)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert_file))  # trust the fake endpoint only
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def arm_creates_budget(start_date: str, today: str) -> bool:
    """Whether ARM creates a monthly cost budget starting on ``start_date`` (YYYY-MM-DD) on
    ``today`` (YYYY-MM-DD). The Consumption REST reference (BudgetTimePeriod.startDate): "Must
    be first of the month ... Future start date should not be more than twelve months. Past
    start date should be selected within the timegrain period" (for a monthly budget: this
    month). An update never moves the start (infra/budget.py ignores it), so only a create
    meets this rule."""
    from datetime import date

    start, now = date.fromisoformat(start_date), date.fromisoformat(today)
    if start.day != 1:
        return False
    first_of_this_month = now.replace(day=1)
    months_ahead = (start.year - now.year) * 12 + start.month - now.month
    return start >= first_of_this_month and months_ahead <= 12


# ---- a container registry, as ACR's Registries API answers for it --------------------------

SUB = "00000000-0000-0000-0000-00000000abcd"
REGISTRY_ID = (
    f"/subscriptions/{SUB}/resourceGroups/rg-team-dev/providers/"
    "Microsoft.ContainerRegistry/registries/teamacr"
)
OPERATION = f"/subscriptions/{SUB}/providers/Microsoft.ContainerRegistry/locations/eastus/op-1"
BYPASS_PROPERTY = "networkRuleBypassAllowedForTasks"
BYPASS_PATCH = {"properties": {BYPASS_PROPERTY: True}}
BYPASS_API_VERSION = "2025-11-01"


class FakeRegistry:
    """ACR's registry endpoint (Registries - Get and Update). ``mode`` is how the PATCH is
    answered: ``sync`` (200 with the updated registry), ``azure-async-operation`` or
    ``location`` (202 and a status monitor that says InProgress once, then ``outcome``). The
    setting turns true when the update succeeds, unless ``honours`` is false (an API that
    ignores the property).

    ``allowed`` is the registry's networkRuleBypassAllowedForTasks as ARM reports it now: an
    owner can turn it off in the portal or with `az resource update` after the stack set it, and
    from then on ACR refuses its tasks' system-assigned identity past the registry's network
    rules with 403 Forbidden (articles/container-registry/
    manage-network-bypass-policy-for-tasks.md); a run's push then fails (``refuses_tasks``).

    ``role_assignment_mode`` is the registry's ``properties.roleAssignmentMode``
    (``LegacyRegistryPermissions``, the default, or ``AbacRepositoryPermissions``; Azure/azure-
    rest-api-specs Registry.models.tsp, in the API from 2025-03-01-preview; None: ARM leaves it
    out, as for a registry that never set it). In the ABAC mode "the AcrPull, AcrPush, and
    AcrDelete roles aren't honored"; the Container Registry Repository roles are (azure-
    management-docs articles/container-registry/container-registry-rbac-abac-repository-
    permissions.md, read 2026-11-28): ``lets_pull`` says whether the registry lets a role pull.
    ``refuse_read`` answers the GET (a deployer without read access to the registry)."""

    def __init__(self, registry_path: str = REGISTRY_ID) -> None:
        self.requests: list[dict[str, Any]] = []
        self.registry_path = registry_path
        self.mode = "sync"
        self.outcome = "Succeeded"
        self.honours = True
        self.refuse: tuple[int, Any] | None = None  # (status, ARM error) for the PATCH
        self.allowed = False
        self.role_assignment_mode: str | None = None
        self.refuse_read: tuple[int, Any] | None = None
        self.pending = False
        self.polls = 0
        self.base = ""

    @property
    def refuses_tasks(self) -> bool:
        return not self.allowed

    def lets_pull(self, role: str) -> bool:
        """Whether a pull by a principal holding ``role`` (by name) gets through."""
        if self.role_assignment_mode == "AbacRepositoryPermissions":
            return role.startswith("Container Registry Repository ")
        return role in ("AcrPull", "AcrPush", "Owner", "Contributor")

    def _registry(self) -> tuple[int, dict[str, str], Any]:
        return (
            200,
            {},
            {
                "id": self.registry_path,
                "name": self.registry_path.rsplit("/", 1)[-1],
                "type": "Microsoft.ContainerRegistry/registries",
                "properties": {
                    "provisioningState": "Succeeded",
                    "publicNetworkAccess": "Enabled",
                    "networkRuleBypassOptions": "AzureServices",
                    BYPASS_PROPERTY: self.allowed,
                    **(
                        {"roleAssignmentMode": self.role_assignment_mode}
                        if self.role_assignment_mode
                        else {}
                    ),
                },
            },
        )

    def _finish(self) -> None:
        self.pending = False
        if self.outcome == "Succeeded" and self.honours:
            self.allowed = True

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, dict[str, str], Any]:
        self.requests.append(
            {"method": method, "path": path, "query": query, "headers": headers, "body": body}
        )
        if path == self.registry_path and method == "PATCH":
            if self.refuse:
                return self.refuse[0], {}, self.refuse[1]
            if body != BYPASS_PATCH:
                return 400, {}, {"error": {"code": "BadRequest", "message": json.dumps(body)}}
            if self.mode == "sync":
                self._finish()
                return self._registry()
            self.pending, self.polls = True, 0
            monitor = f"{self.base}{OPERATION}?api-version={BYPASS_API_VERSION}"
            header = "Azure-AsyncOperation" if self.mode == "azure-async-operation" else "Location"
            return 202, {header: monitor}, None
        if path == self.registry_path and method == "GET":
            if self.refuse_read:
                return self.refuse_read[0], {}, self.refuse_read[1]
            return self._registry()
        if path == OPERATION and method == "GET" and self.pending:
            return self._poll()
        return 404, {}, {"error": {"code": "NotFound", "message": f"{method} {path}"}}

    def _poll(self) -> tuple[int, dict[str, str], Any]:
        self.polls += 1
        if self.polls == 1:
            if self.mode == "location":
                return 202, {"Location": f"{self.base}{OPERATION}"}, None
            return 200, {}, {"status": "InProgress"}
        outcome = self.outcome
        self._finish()
        if self.mode == "location":
            if outcome != "Succeeded":
                return 500, {}, {"error": {"code": outcome, "message": "update failed"}}
            return 200, {}, None
        error = {"code": "UpdateFailed", "message": "registry update failed"}
        return 200, {}, {"status": outcome, **({} if outcome == "Succeeded" else {"error": error})}


class FakeLoginServer:
    """A registry's login server as the docker builder's token exchange meets it
    (``POST /oauth2/exchange``), behind the registry's network rules: with ``defaultAction:
    Deny`` a caller whose address (``caller``, where ACR sees this machine) is outside
    ``ip_rules`` gets 403 ``DENIED`` "client with IP '<ip>' is not allowed access. Refer
    https://aka.ms/acr/firewall to grant access." (SupportArticles-docs, Troubleshoot Azure
    Container Registry authentication issues, read 2026-11-28), before any credential is
    looked at; an admitted one gets a refresh token."""

    def __init__(self, folder: Path, ip_rules: tuple[str, ...], caller: str) -> None:
        self.ip_rules, self.caller = ip_rules, caller
        self.exchanges: list[dict[str, list[str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                send_json(self, *fake.answer(self.path, form))

            def log_message(self, *args: object) -> None:
                pass

        self.server, self.cert = serve_https(Handler, folder, "fake-acr")
        self.login_server = f"127.0.0.1:{self.server.server_port}"

    def answer(self, path: str, form: dict[str, list[str]]) -> tuple[int, Any]:
        import ipaddress

        if path != "/oauth2/exchange":
            return 404, {"errors": [{"code": "NOT_FOUND", "message": path}]}
        address = ipaddress.ip_address(self.caller)
        if not any(address in ipaddress.ip_network(r, strict=False) for r in self.ip_rules):
            message = (
                f"client with IP '{self.caller}' is not allowed access. Refer "
                "https://aka.ms/acr/firewall to grant access."
            )
            return 403, {"errors": [{"code": "DENIED", "message": message}]}
        self.exchanges.append(form)
        return 200, {"refresh_token": "acr-refresh-token"}

    def close(self) -> None:
        self.server.shutdown()
