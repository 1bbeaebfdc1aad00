"""How the node launcher's workers meet, for each engine. Horovod: the master serves Horovod's
Gloo rendezvous, and every worker gets the variables ``horovodrun --gloo`` would set.
torch.distributed (``trainer.config.TORCH_DISTRIBUTED_BACKENDS``): every worker gets the
variables ``torchrun`` would set, and rank 0 serves torch's own store (``env://``). Only the
launcher package imports ``horovod.runner``; the workers' own communication lives in
``trainer.distributed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def start_gloo_rendezvous(port: int, hosts: list[str], slots: int) -> Callable[[], None]:
    """Serve Horovod's Gloo rendezvous (an HTTP key-value store) on ``port`` for ``slots``
    workers on each of ``hosts``; returns a function that stops it. The launcher on the
    master node runs it: no SSH, no MPI daemon. The store also holds the launchers' own keys
    (see ``trainer.launch.supervisor``)."""
    # Imported here: --help and input errors never wait for Horovod.
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    plan = get_host_assignments([HostInfo(host, slots) for host in hosts], len(hosts) * slots)
    server.init(plan)
    thread = threading.Thread(target=server.serve_forever, name="gloo-rendezvous", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def gloo_worker_env(
    master_ip: str, port: int, iface: str, hosts: list[str], node: int, slots: int, local: int
) -> dict[str, str]:
    """The variables ``horovodrun --gloo`` would give worker ``local`` on ``hosts[node]``."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": master_ip,
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
        # (trainer.launch.fabric).
        "GLOO_SOCKET_IFNAME": iface,
        "PYTHONUNBUFFERED": "1",
    }
