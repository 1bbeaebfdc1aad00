"""The master's store answers only the job: requests without its token are refused with one log
line, on a real server on 127.0.0.1 (the one the launcher serves, Horovod's handler inside)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.other_uid import REPO, can_switch_uid, run_as_uid
from tests.support.ports import free_port
from trainer.launch.batch_env import LaunchError, Node
from trainer.launch.rendezvous import gloo_rendezvous_addr, new_token, start_gloo_rendezvous
from trainer.launch.store import Store, join_store


@pytest.fixture
def served() -> Iterator[tuple[int, str, list[str]]]:
    """(port, token, the server's log lines) of a store for two workers on one host."""
    port, token, lines = free_port(), new_token(), []
    stop = start_gloo_rendezvous(port, ["127.0.0.1"], 2, token, lines.append)
    yield port, token, lines
    stop()


def _status(method: str, url: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_writes_and_reads_without_the_token_are_refused_and_logged_in_one_line(served):
    port, token, lines = served
    base = f"http://127.0.0.1:{port}"
    assert _status("PUT", f"{base}/launcher/failed", b"forged") == 403
    assert _status("PUT", f"{base}/{new_token()}:{port}/global/0", b"forged") == 403
    assert _status("GET", f"{base}/launcher/attempt") == 403
    assert _status("DELETE", f"{base}/global/0") == 403
    assert len(lines) == 4
    assert lines[0] == "refused PUT .../failed from 127.0.0.1: no valid job token"
    assert all(line.startswith("refused ") and "\n" not in line for line in lines)
    assert not any(token in line for line in lines)
    # Nothing forged landed: the job reads its own keys only.
    store = Store("127.0.0.1", port, token)
    assert store.get("failed") is None
    store.put("failed", "node 2 worker 0 exited with 1")
    assert store.get("failed") == "node 2 worker 0 exited with 1"
    assert len(lines) == 4  # the job's own requests log nothing
    # Inherited from a file server, HEAD would have listed this process's folder.
    assert _status("HEAD", f"{base}/") == 405


def test_horovods_requests_carry_the_token_as_its_client_builds_them(served):
    """Horovod's C++ store requests ``http://<ADDR>:<PORT>/<scope>/<key>``; its HTTP client
    splits host and port at the first ``/`` (third_party/HTTPRequest), as urllib does."""
    port, token, lines = served
    addr = gloo_rendezvous_addr("127.0.0.1", port, token)
    url = f"http://{addr}:{port}/global/0"
    assert url.startswith(f"http://127.0.0.1:{port}/")
    assert _status("PUT", url, b"rank 0's address") == 200
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.read() == b"rank 0's address"
    assert _status("GET", f"http://127.0.0.1:{port}/global/0") == 403
    assert len(lines) == 1


def test_a_node_that_read_an_earlier_launchs_token_keeps_trying_until_the_new_one(served):
    port, token, lines = served
    node = Node(["127.0.0.1", "127.0.0.2"], 1, "127.0.0.1", port, False, "lo")
    published = iter([None, new_token(), token])  # not yet, a stale file, this launch's
    store = join_store(node, lambda: next(published), seconds=30, sleep=0)
    assert store.token == token
    assert len(lines) == 1  # the stale token's probe was refused and logged
    with pytest.raises(LaunchError, match="did not answer to this launch's token in 0 s"):
        join_store(node, new_token, seconds=0, sleep=0)


# The master's and another node's task user: Batch's pool-scope auto-user, whose uid Batch does
# not document and each node creates on its own (the containers get that uid mapped in).
MASTER_UID, OTHER_UID = 20001, 20002


def _as_uid(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    return run_as_uid(uid, [sys.executable, "-c", code, *args], env, timeout=60)


@pytest.mark.skipif(not can_switch_uid(), reason="setpriv --reuid needs root")
def test_a_node_whose_task_user_has_another_uid_reads_the_masters_token():
    """The run folder on the shared file system, written by the master's uid and read by
    another node's (NFS grants by numeric uid, as this local folder does)."""
    shared = Path(tempfile.mkdtemp(prefix="runs-"))
    try:
        shared.chmod(0o1777)  # the export's runs folder (infra.cloud_init RUNS_MODE)
        run = str(shared / "stack" / "run")
        records = "import sys; from pathlib import Path; from trainer.launch.records import "
        records += "RunRecords; records = RunRecords(Path(sys.argv[1]))\n"
        published = _as_uid(MASTER_UID, records + "records.publish_token(sys.argv[2])", run, "t")
        assert published.returncode == 0, published.stderr
        read = _as_uid(OTHER_UID, records + "print(records.read_token())", run)
        assert read.returncode == 0, read.stderr
        assert read.stdout.strip() == "t"
    finally:
        shutil.rmtree(shared)
