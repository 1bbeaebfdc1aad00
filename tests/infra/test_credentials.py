"""The process's one Azure credential against a token service whose GitHub ID tokens expire
five minutes after issue (tests/support/fake_entra.py)."""

from __future__ import annotations

import os
import sys

import pytest
from azure.core.exceptions import ClientAuthenticationError

from infra import credentials
from tests.support.fake_entra import FakeEntra, write_federated_az

BATCH = "https://batch.core.windows.net//.default"
ARM = "https://management.azure.com/.default"


@pytest.fixture
def entra(tmp_path):
    service = FakeEntra(tmp_path / "entra")
    yield service
    service.close()


@pytest.fixture
def github(entra, tmp_path, monkeypatch):
    """A deploy step after ``azure/login``: GitHub's OIDC variables, the deploy's identity and
    an ``az`` holding the ID token it logged in with."""
    for name in [n for n in os.environ if n.startswith(("AZURE_", "ARM_"))]:
        if name != "AZURE_IMDS_URL":  # tests/conftest.py: no real metadata service
            monkeypatch.delenv(name)
    for name, value in entra.github_env().items():
        monkeypatch.setenv(name, value)
    write_federated_az(tmp_path / "bin", sys.executable)
    assertion = tmp_path / "az-assertion"
    assertion.write_text(entra.id_token())  # what `az login --federated-token` was given
    monkeypatch.setenv("AZ_ASSERTION_FILE", str(assertion))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    credentials.credential.cache_clear()
    yield entra
    credentials.credential.cache_clear()


def test_the_az_login_of_a_deploy_cannot_get_a_new_token_after_five_minutes(github):
    # The fake's behaviour, through the credential the providers used before: az's stored
    # assertion serves a token at first and is refused once it is five minutes old.
    from azure.identity import AzureCliCredential

    assert github.accepts(AzureCliCredential().get_token(ARM).token, ARM)
    github.advance(6 * 60)
    with pytest.raises(ClientAuthenticationError, match="AADSTS700024"):
        AzureCliCredential().get_token(BATCH)


def test_under_github_oidc_every_new_token_trades_a_fresh_id_token(github):
    credential = credentials.credential()
    assert type(credential).__name__ == "ClientAssertionCredential"
    # The first Batch call of a new stack comes long after the login.
    github.advance(25 * 60)
    batch = credential.get_token(BATCH).token
    assert github.accepts(batch, BATCH)
    # A long image build's poll asks for an ARM token two hours in.
    github.advance(2 * 60 * 60)
    assert github.accepts(credential.get_token(ARM).token, ARM)
    assert github.id_tokens_issued == 3  # the login's, then one per Entra token
    assert not github.refusals


def test_a_refused_id_token_request_is_an_authentication_error(github, monkeypatch):
    monkeypatch.setenv(credentials.GITHUB_REQUEST_TOKEN, "a-token-the-runner-did-not-issue")
    with pytest.raises(ClientAuthenticationError, match=r"GitHub gave no ID token .*401.*id-token"):
        credentials.credential().get_token(BATCH)


@pytest.mark.parametrize(
    "missing",
    [credentials.GITHUB_REQUEST_URL, credentials.GITHUB_REQUEST_TOKEN, "ARM_CLIENT_ID"],
)
def test_without_github_oidc_the_default_chain_is_used(github, monkeypatch, missing):
    monkeypatch.delenv(missing)
    assert not credentials.under_github_oidc()
    assert type(credentials.credential()).__name__ == "DefaultAzureCredential"


def test_the_azure_names_of_the_identity_count_too(github, monkeypatch):
    client_id, tenant = github.github_env()["ARM_CLIENT_ID"], github.github_env()["ARM_TENANT_ID"]
    monkeypatch.delenv("ARM_CLIENT_ID")
    monkeypatch.delenv("ARM_TENANT_ID")
    monkeypatch.setenv("AZURE_CLIENT_ID", client_id)
    monkeypatch.setenv("AZURE_TENANT_ID", tenant)
    assert github.accepts(credentials.credential().get_token(BATCH).token, BATCH)


def test_one_credential_per_process(github):
    assert credentials.credential() is credentials.credential()
