"""How the node launcher's workers meet, for each engine. Horovod: the master serves Horovod's
Gloo rendezvous, and every worker gets the variables ``horovodrun --gloo`` would set.
torch.distributed (``trainer.settings.choices.TORCH_DISTRIBUTED_BACKENDS``): every worker gets the
variables ``torchrun`` would set, and rank 0 serves torch's own store (``env://``). Only the
launcher package imports ``horovod.runner``; the workers' own communication lives in
``trainer.engines.base``.
Why it is built this way: docs/internals.md, `trainer/launch/rendezvous.py`."""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from trainer.common.files import open_atomic

# 32 random bytes, URL-safe base64 (letters, digits, "-" and "_"): a path segment as it is.
TOKEN_BYTES = 32
# The token file in the run folder on the shared file system, where the master hands the token
# to the other nodes. Readable by every uid, not 0600: the nodes' task user is Batch's pool-scope
# auto-user, mapped into each container with a uid Batch does not document and creates on each
# node on its own (articles/batch/batch-docker-container-workloads.md), while NFS (AUTH_SYS)
# grants access by the numeric uid; a 0600 file of the master's uid is unreadable wherever that
# user got another uid (and readable by whatever account holds that uid there). The file is no
# wider than the run folder it lives in: only the compute subnet mounts the share (the NFS
# server's export, the Azure Files share's network rules), and whoever can read the run folder
# can already rewrite its checkpoints; what the token keeps out is the rest of the VNet, which
# cannot read the share.
TOKEN_FILE_MODE = 0o644


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def publish_token(path: Path, token: str) -> None:
    """Write the master's ``token`` to ``path`` atomically, readable by the job's other nodes
    whatever their uid (``TOKEN_FILE_MODE``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_atomic(path) as file:
        os.fchmod(file.fileno(), TOKEN_FILE_MODE)
        file.write(token.encode())


def read_token(path: Path) -> str | None:
    """The token the master published at ``path``, None until it did (or while it cannot be
    read)."""
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def job_segment(token: str, port: int) -> str:
    """The first path segment of every request to the job's store: what Horovod's client puts
    there from ``gloo_rendezvous_addr`` (the token, then ``:`` and the port it appends)."""
    return f"{token}:{port}"


def gloo_rendezvous_addr(master_ip: str, port: int, token: str) -> str:
    """HOROVOD_GLOO_RENDEZVOUS_ADDR that makes Horovod's requests carry the token (how:
    docs/internals.md)."""
    return f"{master_ip}:{port}/{token}"


def start_gloo_rendezvous(
    port: int, hosts: list[str], slots: int, token: str, log: Callable[[str], None]
) -> Callable[[], None]:
    """Serve Horovod's Gloo rendezvous (an HTTP key-value store) on ``port`` for ``slots``
    workers on each of ``hosts``, to requests that carry ``token`` (``log`` gets one line per
    refused request); returns a function that stops it. The launcher on the master node runs
    it: no SSH, no MPI daemon. The store also holds the launchers' own keys (see
    ``trainer.launch.store``)."""
    # Imported here: --help and input errors never wait for Horovod.
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHTTPServer

    handler = _job_only_handler(f"/{job_segment(token, port)}/", log)
    server = RendezvousHTTPServer(("", port), handler, 0)
    plan = get_host_assignments([HostInfo(host, slots) for host in hosts], len(hosts) * slots)
    server.init(plan)
    thread = threading.Thread(target=server.serve_forever, name="gloo-rendezvous", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def _job_only_handler(segment: str, log: Callable[[str], None]) -> type:
    """Horovod's rendezvous handler, admitting only requests under the job's path segment."""
    from horovod.runner.http.http_server import RendezvousHandler

    class JobOnlyHandler(RendezvousHandler):
        """Horovod's handler behind the job's path segment, which is removed before it runs."""

        def _admit(self) -> bool:
            if secrets.compare_digest(self.path[: len(segment)].encode(), segment.encode()):
                self.path = "/" + self.path[len(segment) :]
                return True
            # Without the first segment: a near miss of the token must not land in a log.
            rest = "/".join(self.path.split("/")[2:])[:80]
            log(
                f"refused {self.command} .../{rest} from {self.client_address[0]}: "
                "no valid job token"
            )
            self.send_status_code(403)
            return False

        def do_GET(self) -> None:
            if self._admit():
                super().do_GET()

        def do_PUT(self) -> None:
            if self._admit():
                super().do_PUT()

        def do_DELETE(self) -> None:
            if self._admit():
                super().do_DELETE()

        # Inherited from SimpleHTTPRequestHandler, these would serve this process's working
        # folder; the store answers GET, PUT and DELETE only.
        def do_HEAD(self) -> None:
            self._refuse_method()

        def do_POST(self) -> None:
            self._refuse_method()

        def _refuse_method(self) -> None:
            self.send_status_code(405)

    return JobOnlyHandler


def gloo_worker_env(
    master_ip: str,
    port: int,
    token: str,
    iface: str,
    hosts: list[str],
    node: int,
    slots: int,
    local: int,
) -> dict[str, str]:
    """The variables ``horovodrun --gloo`` would give worker ``local`` on ``hosts[node]``, the
    rendezvous address carrying the job's ``token``."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": gloo_rendezvous_addr(master_ip, port, token),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_HOSTNAME": hosts[node],
        "HOROVOD_RANK": str(node * slots + local),
        "HOROVOD_SIZE": str(len(hosts) * slots),
        "HOROVOD_LOCAL_RANK": str(local),
        "HOROVOD_LOCAL_SIZE": str(slots),
        "HOROVOD_CROSS_RANK": str(node),
        "HOROVOD_CROSS_SIZE": str(len(hosts)),
        "PYTHONUNBUFFERED": "1",
    }


def torch_worker_env(
    master_ip: str, port: int, iface: str, nodes: int, node: int, slots: int, local: int
) -> dict[str, str]:
    """The variables ``torchrun --nnodes {nodes} --nproc-per-node {slots} --node-rank {node}``
    would give worker ``local``: torch.distributed's ``env://`` rendezvous, where rank 0 serves
    a TCPStore on ``master_ip:port`` and every other rank connects to it. Ranks are numbered as
    Horovod's are (node by node), so rank 0 is on the master node, whose address this is."""
    return {
        "MASTER_ADDR": master_ip,
        "MASTER_PORT": str(port),
        "RANK": str(node * slots + local),
        "WORLD_SIZE": str(nodes * slots),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(slots),
        "GROUP_RANK": str(node),
        "NODE_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nodes),
        # Gloo (torch's CPU collectives) uses the interface of this node's Batch address, as
        # HOROVOD_GLOO_IFACE makes Horovod's Gloo do; NCCL has its own setting from the VM size
        # (trainer.launch.node_sizes).
        "GLOO_SOCKET_IFNAME": iface,
        "PYTHONUNBUFFERED": "1",
    }
