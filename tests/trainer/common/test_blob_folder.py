"""Blob folder URLs as the trainer's live upload and the operator CLI split them."""

import pytest

from trainer.common.blob_folder import BlobFolder


@pytest.mark.parametrize(
    ("url", "account_url", "container", "prefix"),
    [
        (
            "https://acct.blob.core.windows.net/logs/dev-1a2b/live/",
            "https://acct.blob.core.windows.net",
            "logs",
            "dev-1a2b/live/",
        ),
        # The trailing slash is optional; the folder is the same.
        (
            "https://acct.blob.core.windows.net/logs/dev-1a2b/live",
            "https://acct.blob.core.windows.net",
            "logs",
            "dev-1a2b/live/",
        ),
        (
            "https://acct.blob.core.windows.net/logs",
            "https://acct.blob.core.windows.net",
            "logs",
            "",
        ),
        # Path-style, as the SDK reads an IP address or localhost: the account comes first.
        (
            "https://127.0.0.1:10000/devstoreaccount1/logs/j/live/",
            "https://127.0.0.1:10000/devstoreaccount1",
            "logs",
            "j/live/",
        ),
        (
            "https://localhost/devstoreaccount1/logs/a%20b/",
            "https://localhost/devstoreaccount1",
            "logs",
            "a b/",
        ),
    ],
)
def test_urls_split_into_account_container_and_prefix(url, account_url, container, prefix):
    folder = BlobFolder.parse(url)
    assert (folder.account_url, folder.container, folder.prefix) == (account_url, container, prefix)
    assert folder.blob("tensorboard/events.1") == prefix + "tensorboard/events.1"
    assert BlobFolder.parse(folder.url) == folder


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://acct.blob.core.windows.net/logs/x/", "must be an https:// blob folder URL"),
        ("logs/x", "must be an https:// blob folder URL"),
        ("https://[::1/logs/", "not a URL"),
        ("https://acct.blob.core.windows.net:port/logs/", "not a URL"),
        ("https://acct.blob.core.windows.net/logs/x/?sv=1&sig=2", "no SAS token"),
        ("https://user@acct.blob.core.windows.net/logs/x/", "no SAS token"),
        ("https://acct.blob.core.windows.net/", "names no container"),
        ("https://127.0.0.1:10000/devstoreaccount1/", "names no container"),
        ("https://127.0.0.1:10000/", "names no account"),
        ("https://acct.blob.core.windows.net/Logs/x/", "container 'Logs' is not a valid"),
        ("https://acct.blob.core.windows.net/a--b/x/", "container 'a--b' is not a valid"),
        ("https://acct.blob.core.windows.net/logs/../x/", "must not contain . or .."),
    ],
)
def test_bad_urls_say_why_in_one_line(url, reason):
    with pytest.raises(ValueError) as caught:
        BlobFolder.parse(url)
    assert reason in str(caught.value) and "\n" not in str(caught.value)
