"""A fake Microsoft Entra token endpoint and a fake GitHub Actions OIDC issuer on one HTTPS
server on 127.0.0.1, with a clock the test moves (``advance``), and the ``az`` a GitHub deploy
has after ``azure/login``.

What they model, each as Azure or GitHub behave:
- GitHub's ID token, the federated assertion a workflow trades for Entra tokens, is valid for
  five minutes from issue; Entra then refuses it with ``AADSTS700024: Client assertion is not
  within its valid time range`` (Azure/login #180 quotes "assertion valid from 06:01:13Z,
  expiry time of assertion 06:06:13Z").
- ``az login --federated-token`` keeps the one assertion it was given and uses it for every
  token it must fetch later; it cannot ask GitHub for another (Azure/azure-cli #28708, PR
  #33989; Azure/login #372): ``AZ_FEDERATED`` is such an ``az``.
- A resource accepts only access tokens this service issued for its own audience
  (``accepts``); the fake Batch asks it when given the service.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.replies import send_json
from tests.support.tls import serve_https

TENANT = "5d4a3c2b-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
CLIENT_ID = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"  # the deploy's app registration
GITHUB_AUDIENCE = "api://AzureADTokenExchange"
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
ID_TOKEN_SECONDS = 300  # Azure/login #180: a GitHub ID token lives five minutes
ACCESS_TOKEN_SECONDS = 3600
REQUEST_TOKEN = "github-runner-request-token"  # ACTIONS_ID_TOKEN_REQUEST_TOKEN
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.sig"


def _claims(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


class FakeEntra:
    def __init__(self, folder: Path) -> None:
        self._lock = threading.Lock()
        self._offset = 0.0
        self.id_tokens_issued = 0
        self.refusals: list[str] = []
        self._access: dict[str, str] = {}  # access token -> the scope it was issued for
        fake = self

        class Handler(_Handler):
            entra = fake

        self._server, self.ca_path = serve_https(Handler, folder, "fake-entra")
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def now(self) -> float:
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move this service's clock (and only its clock) ahead."""
        with self._lock:
            self._offset += seconds

    def github_env(self) -> dict[str, str]:
        """What a GitHub Actions step with ``id-token: write`` and the deploy's ARM_* sees."""
        return {
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.url}/github/token?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": REQUEST_TOKEN,
            "ARM_CLIENT_ID": CLIENT_ID,
            "ARM_TENANT_ID": TENANT,
            "AZURE_AUTHORITY_HOST": self.url,
            "REQUESTS_CA_BUNDLE": str(self.ca_path),
            "SSL_CERT_FILE": str(self.ca_path),
        }

    def id_token(self, audience: str = GITHUB_AUDIENCE) -> str:
        now = self.now()
        with self._lock:
            self.id_tokens_issued += 1
        return _jwt(
            {
                "iss": GITHUB_ISSUER,
                "aud": audience,
                "sub": "repo:team/distributed-training:environment:production",
                "nbf": int(now),
                "iat": int(now),
                "exp": int(now) + ID_TOKEN_SECONDS,
            }
        )

    def accepts(self, token: str, scope: str) -> bool:
        with self._lock:
            return self._access.get(token) == scope

    def exchange(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Entra's client-credentials grant with a federated assertion."""
        federated = form.get("client_assertion_type") == ASSERTION_TYPE
        if not federated or form.get("client_id") != CLIENT_ID:
            return self._refuse("invalid_client", "AADSTS700016: Application not found.")
        claims = _claims(form.get("client_assertion", "x.e30.x"))
        if claims.get("aud") != GITHUB_AUDIENCE or claims.get("iss") != GITHUB_ISSUER:
            return self._refuse("invalid_client", "AADSTS70021: No matching federated identity.")
        if not claims.get("nbf", 0) <= self.now() < claims.get("exp", 0):
            return self._refuse(
                "invalid_client",
                "AADSTS700024: Client assertion is not within its valid time range.",
            )
        token = f"access-{uuid.uuid4().hex}"
        with self._lock:
            self._access[token] = form.get("scope", "")
        body = {"token_type": "Bearer", "expires_in": ACCESS_TOKEN_SECONDS, "access_token": token}
        return 200, body

    def _refuse(self, error: str, description: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.refusals.append(description)
        return 400, {"error": error, "error_description": description, "error_codes": [700024]}


class _Handler(BaseHTTPRequestHandler):
    entra: FakeEntra

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/github/token":
            return send_json(self, 404, {"message": "Not Found"})
        if self.headers.get("Authorization", "").lower() != f"bearer {REQUEST_TOKEN}":
            return send_json(self, 401, {"message": "Bad credentials"})
        audience = query.get("audience", "https://github.com/team")
        send_json(self, 200, {"count": 1, "value": self.entra.id_token(audience)})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        form = {k: v[0] for k, v in parse_qs(raw).items()}
        if url.path != f"/{TENANT}/oauth2/v2.0/token":
            return send_json(self, 400, {"error": "invalid_tenant"})
        send_json(self, *self.entra.exchange(form))

    def log_message(self, *args: object) -> None:
        pass


# `az` after `azure/login` with OIDC: `az login --federated-token` stored the assertion in
# AZ_ASSERTION_FILE; every `az account get-access-token` trades that same assertion.
AZ_FEDERATED = """#!{python}
import json, os, ssl, sys, urllib.error, urllib.parse, urllib.request

args = sys.argv[1:]
# azure-identity asks for `--resource R`, which az turns into the scope R/.default.
if "--scope" in args:
    scope = args[args.index("--scope") + 1]
else:
    scope = args[args.index("--resource") + 1] + "/.default"
form = urllib.parse.urlencode({{
    "client_id": os.environ["ARM_CLIENT_ID"],
    "client_assertion_type": "{assertion_type}",
    "client_assertion": open(os.environ["AZ_ASSERTION_FILE"]).read(),
    "grant_type": "client_credentials",
    "scope": scope,
}}).encode()
url = os.environ["AZURE_AUTHORITY_HOST"] + "/" + os.environ["ARM_TENANT_ID"] + "/oauth2/v2.0/token"
context = ssl.create_default_context(cafile=os.environ["REQUESTS_CA_BUNDLE"])
try:
    body = json.load(urllib.request.urlopen(url, form, context=context))
except urllib.error.HTTPError as err:
    sys.stderr.write("ERROR: " + json.load(err)["error_description"] + "\\n")
    sys.exit(1)
expires = int(__import__("time").time()) + body["expires_in"]
print(json.dumps({{"accessToken": body["access_token"], "expires_on": expires,
    "expiresOn": "2099-01-01 00:00:00.000000", "tokenType": "Bearer",
    "subscription": "s", "tenant": os.environ["ARM_TENANT_ID"]}}))
"""


def write_federated_az(bin_dir: Path, python: str) -> Path:
    """An ``az`` in ``bin_dir`` that behaves as after ``az login --federated-token``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    az = bin_dir / "az"
    az.write_text(AZ_FEDERATED.format(python=python, assertion_type=ASSERTION_TYPE))
    az.chmod(0o755)
    return az
