"""The fakes' one way of answering an HTTP request (tests/support/replies.py), on a real server
and a real client."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.replies import send_body, send_json

Answer = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def _serving(answer: Answer) -> Iterator[http.client.HTTPConnection]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            answer(self)

        do_GET = do_HEAD = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
    try:
        yield connection
    finally:
        connection.close()
        server.shutdown()
        server.server_close()
        thread.join()


def _get(answer: Answer, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    with _serving(answer) as connection:
        connection.request(method, "/")
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()


def test_a_json_answer_carries_its_type_length_and_headers():
    status, headers, body = _get(lambda h: send_json(h, 201, {"a": [1]}, {"x-ms-id": "7"}))
    assert status == 201 and json.loads(body) == {"a": [1]}
    assert headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == str(len(body)) and headers["x-ms-id"] == "7"


def test_a_json_answer_may_name_its_own_type_and_none_is_an_empty_body():
    kind = "application/json;odata=minimalmetadata"
    _, headers, body = _get(lambda h: send_json(h, 200, {}, content_type=kind))
    assert headers["Content-Type"] == kind and body == b"{}"
    status, headers, body = _get(lambda h: send_json(h, 202, None))
    assert status == 202 and body == b"" and headers["Content-Length"] == "0"
    assert "Content-Type" not in headers


def test_a_head_request_gets_the_headers_alone():
    status, headers, body = _get(lambda h: send_json(h, 200, {"a": 1}), "HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(b'{"a": 1}'))


def test_a_body_keeps_a_length_it_was_given():
    """A HEAD answer of a file says the file's length, not the empty body's."""
    answer: Answer = lambda h: send_body(h, 200, b"", {"Content-Length": "12"})  # noqa: E731
    _, headers, body = _get(answer, "HEAD")
    assert headers["Content-Length"] == "12" and body == b""
    _, headers, body = _get(lambda h: send_body(h, 200, b"text", {"Content-Type": "text/plain"}))
    assert body == b"text" and headers["Content-Type"] == "text/plain"
