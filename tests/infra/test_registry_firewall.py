"""The docker builder logs in to the registry from the machine running `pulumi up`, and the
registry's network rules apply before any credential (tests/infra/fake_arm.py,
FakeLoginServer): a machine outside registryAllowedIps is refused, which stops the program in
one line naming the setting, and a stack that builds with docker while registryAllowedIps is
empty is refused when it is planned."""

from __future__ import annotations

import pulumi
import pytest

from infra import credentials
from infra import image as image_module
from infra.settings.checks import ConfigError
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.infra.fake_arm import FakeLoginServer
from tests.support.stacks import CLIENT_IP, stack_values


class EntraToken:
    def get_token(self, scope):
        return type("Token", (), {"token": "entra-access-token"})()


@pytest.fixture
def login_server(tmp_path, monkeypatch):
    monkeypatch.setattr(credentials, "credential", EntraToken)
    servers: list[FakeLoginServer] = []

    def serve(caller: str) -> FakeLoginServer:
        server = FakeLoginServer(tmp_path / f"acr{len(servers)}", (CLIENT_IP,), caller)
        monkeypatch.setenv("SSL_CERT_FILE", str(server.cert))  # urllib trusts the fake alone
        servers.append(server)
        return server

    yield serve
    for server in servers:
        server.close()


def test_a_machine_the_registry_admits_gets_its_refresh_token(login_server):
    server = login_server(CLIENT_IP)
    assert image_module.exchange_acr_token(server.login_server) == "acr-refresh-token"
    (form,) = server.exchanges
    assert form["access_token"] == ["entra-access-token"]


def test_a_machine_outside_the_registrys_rules_stops_the_program_in_one_line(login_server):
    server = login_server("203.0.113.200")
    with pytest.raises(pulumi.RunError) as refused:  # Pulumi prints it without a traceback
        image_module.exchange_acr_token(server.login_server)
    message = str(refused.value)
    assert message.startswith(
        f"imageBuilder=docker: registry {server.login_server} refused the push login (403 "
        "DENIED: client with IP '203.0.113.200' is not allowed access."
    )
    assert "registryAllowedIps" in message and "\n" not in message and not server.exchanges


def test_docker_builds_with_no_registry_address_allowed_are_refused_when_planned():
    values = {**stack_values("dev"), "gpu-cluster:imageBuilder": "docker"}
    with pytest.raises(ConfigError) as refused:
        StackSettings.from_mapping("dev", values, load_schema())
    assert str(refused.value).startswith("imageBuilder=docker: the image is pushed from")
    assert "registryAllowedIps" in str(refused.value)
