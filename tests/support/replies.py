"""How the fake servers answer a request: a status, headers and a body with its length, JSON
or bytes (a HEAD request gets the headers alone). One home, so no fake writes a response by
hand."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

JSON = "application/json"


def send_body(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    reason: str | None = None,
) -> None:
    """Answer ``handler``'s request with ``body`` and ``headers`` (and ``reason`` as the status
    line's phrase, else the standard one); the Content-Length is the body's unless ``headers``
    give one (a HEAD answer about a file says the file's)."""
    headers = dict(headers or {})
    handler.send_response(status, reason)
    for name, value in headers.items():
        handler.send_header(name, value)
    if "Content-Length" not in headers:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    content_type: str = JSON,
) -> None:
    """Answer with ``body`` as JSON under ``content_type`` (``headers`` may replace it); None
    is an empty body without a Content-Type."""
    data = b"" if body is None else json.dumps(body).encode()
    kind = {"Content-Type": content_type} if data else {}
    send_body(handler, status, data, {**kind, **(headers or {})})
