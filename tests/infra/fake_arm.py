"""A fake Azure Resource Manager on 127.0.0.1 over TLS for the tests of the dynamic providers
that call ARM themselves (the image build, the registry's task bypass): the real azure-mgmt and
azure-core clients talk to it with a fake Entra token, trusting only its certificate."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.tls import serve_https

# (method, path, query, headers, body) -> (status, response headers, JSON body or None)
# A status of DROP closes the connection without an answer (a connection reset mid-request).
DROP = -1
Handle = Callable[
    [str, str, dict[str, list[str]], dict[str, str], Any], tuple[int, dict[str, str], Any]
]


@contextmanager
def serving_arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Handle) -> Iterator[str]:
    """Serve ``handle`` as ARM; yields its base URL. ``DefaultAzureCredential`` gives a token for
    ARM's scope only, and no proxy stands between the client and the fake."""
    import azure.identity
    from azure.core.credentials import AccessToken

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
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

    class FakeCredential:
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            assert scopes == ("https://management.azure.com/.default",)
            return AccessToken("fake-arm-token", 4102444800)

    server, cert_file = serve_https(Handler, tmp_path, "fake-arm")
    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", FakeCredential)
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
