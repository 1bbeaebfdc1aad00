import pytest

from tests.conftest import checksums
from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, Manifest
from trainer.data.transfer import container_client, stage, stage_args, upload

QUIET = {"log": lambda _: None}


def test_upload_then_stage_round_trip_with_identical_checksums(tmp_path, shards, container):
    sent = upload(shards, container, "imagenet-mini", parallel=4, **QUIET)
    manifest = Manifest.load(shards)
    assert sent.copied == len(manifest.shards) and sent.skipped == 0
    blobs = {b.name: b for b in container.list_blobs(include=["metadata"])}
    shard = manifest.shards[0]
    assert blobs[f"imagenet-mini/{shard.name}"].metadata == {"sha256": shard.sha256}
    assert f"imagenet-mini/{MANIFEST_NAME}" in blobs

    got = stage(container, "imagenet-mini", tmp_path / "nfs", parallel=4, **QUIET)
    assert got.copied == len(manifest.shards)
    assert checksums(tmp_path / "nfs") == checksums(shards)

    # Reruns are resumable no-ops: everything verified is skipped.
    assert upload(shards, container, "imagenet-mini", **QUIET).copied == 0
    again = stage(container, "imagenet-mini", tmp_path / "nfs", **QUIET)
    assert (again.copied, again.skipped) == (0, len(manifest.shards))


class CorruptFirstDownloads:
    """Wraps a ContainerClient; the first ``bad`` downloads of each blob return flipped bytes."""

    def __init__(self, inner, bad):
        self.inner, self.bad, self.calls = inner, bad, {}
        self.url = inner.url

    def download_blob(self, name, **kwargs):
        downloader = self.inner.download_blob(name, **kwargs)
        self.calls[name] = self.calls.get(name, 0) + 1
        if name.endswith(".tar") and self.calls[name] <= self.bad:
            data = bytearray(downloader.readall())
            data[600] ^= 0xFF

            class Flipped:
                def chunks(self):
                    yield bytes(data)

            return Flipped()
        return downloader


def test_checksum_mismatch_is_downloaded_again(tmp_path, shards, container):
    upload(shards, container, "ds", **QUIET)
    flaky = CorruptFirstDownloads(container, bad=1)
    stage(flaky, "ds", tmp_path / "dest", **QUIET)
    assert checksums(tmp_path / "dest") == checksums(shards)
    assert set(flaky.calls.values()) >= {2}


def test_persistent_checksum_mismatch_fails_naming_the_shard(tmp_path, shards, container):
    upload(shards, container, "ds", **QUIET)
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=r"shard ds/\w+-\d+\.tar: SHA-256 .* after 2 downloads"):
        stage(CorruptFirstDownloads(container, bad=2), "ds", dest, parallel=1, **QUIET)
    assert MANIFEST_NAME not in {p.name for p in dest.iterdir()}
    assert not any(".partial-" in p.name for p in dest.iterdir())


def test_upload_refuses_shards_that_do_not_match_the_manifest(shards, container):
    name = Manifest.load(shards).shards[0].name
    data = bytearray((shards / name).read_bytes())
    data[700] ^= 1
    (shards / name).write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"shard .*{name} does not match manifest.json"):
        upload(shards, container, "ds", **QUIET)
    assert list(container.list_blobs()) == []


def test_stage_of_a_missing_dataset_says_upload_first(tmp_path, container):
    with pytest.raises(DataError, match=r"ds/manifest.json: not found .*upload the dataset"):
        stage(container, "ds", tmp_path / "dest", **QUIET)


def test_only_https_endpoints_with_entra_credentials(monkeypatch):
    with pytest.raises(DataError, match=r"account_url=http://x: use the https://"):
        container_client("http://x", "datasets")
    client = container_client("https://acct.blob.core.windows.net", "datasets")
    assert type(client.credential).__name__ == "DefaultAzureCredential"


def test_stage_args_name_every_setting():
    args = stage_args("https://a.blob.core.windows.net", "datasets", "in 1k", "/mnt/d")
    assert args == [
        "python",
        "-m",
        "trainer.data",
        "stage",
        "--account-url",
        "https://a.blob.core.windows.net",
        "--container",
        "datasets",
        "--prefix",
        "in 1k",
        "--dest",
        "/mnt/d",
    ]
