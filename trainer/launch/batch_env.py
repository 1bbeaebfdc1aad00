"""Where this node stands in a Batch multi-instance task: the nodes (``AZ_BATCH_HOST_LIST``), the
master's address (``AZ_BATCH_MASTER_NODE``, never its port), whether this node is the master,
its network interface, and the ports the rendezvous and torch's store take. Pure reading of the
environment: it starts nothing.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import psutil

from trainer.common.errors import one_line

# Batch reserves the port in AZ_BATCH_MASTER_NODE for itself; its docs say to use MASTER_PORT
# instead, "port 6105 is a good default choice"
# (articles/batch/batch-compute-node-environment-variables.md).
DEFAULT_PORT = 6105
# torch.distributed's env:// rendezvous: rank 0 (on the master) serves torch's TCPStore on
# MASTER_ADDR:MASTER_PORT. The master already listens on the rendezvous port (the launchers' own
# store, which every engine's launchers use) and Batch on the port in AZ_BATCH_MASTER_NODE, so
# the TCPStore takes the port after the rendezvous port: one setting (MASTER_PORT or --port)
# places both, and the workers' inherited MASTER_PORT (the launchers') is replaced by it.
TORCH_PORT_OFFSET = 1


class LaunchError(RuntimeError):
    """The Batch environment or the options cannot start a run; one line for the user."""


@dataclass(frozen=True)
class Node:
    hosts: list[str]
    index: int
    master_ip: str
    port: int
    is_master: bool
    iface: str
    node_id: str = ""  # AZ_BATCH_NODE_ID: what `dt-jobs keep-out` and the portal call it

    @property
    def name(self) -> str:
        return self.hosts[self.index]

    @property
    def label(self) -> str:
        """The node as a failure names it: its address and, on Batch, its node id."""
        return f"{self.name} ({self.node_id})" if self.node_id else self.name

    @property
    def master_first_rank(self) -> int:
        """This node's place with the master first, then the others as listed: torch's rank 0
        serves the TCPStore at MASTER_ADDR, the master, and Batch "designates one of the
        compute nodes as the master" without saying where AZ_BATCH_HOST_LIST puts it
        (articles/batch/batch-mpi.md)."""
        others = [host for host in self.hosts if host != self.master_ip]
        return [self.master_ip, *others].index(self.name)


def interface_of(ip: str, *, exact: bool = True) -> str | None:
    """The interface holding ``ip``; with ``exact=False`` also one whose subnet contains it
    (127.0.0.2 lives on ``lo`` without being listed)."""
    wanted = ipaddress.ip_address(ip)
    for iface, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family != socket.AF_INET:
                continue
            if address.address == ip:
                return iface
            if not exact and address.netmask:
                network = ipaddress.ip_network(f"{address.address}/{address.netmask}", strict=False)
                if wanted in network:
                    return iface
    return None


def rendezvous_port(env: dict[str, str], option: int | None) -> int:
    """``--port``, else ``MASTER_PORT``, else 6105; never the port in ``AZ_BATCH_MASTER_NODE``."""
    if option is not None:
        source, text = "--port", str(option)
    elif env.get("MASTER_PORT"):
        source, text = "MASTER_PORT", env["MASTER_PORT"]
    else:
        return DEFAULT_PORT
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise LaunchError(f"{source}={one_line(text)}: expected a TCP port number 1-65535")
    return int(text)


def torch_master_port(rendezvous: int, env: dict[str, str]) -> int:
    """The ``MASTER_PORT`` of torch.distributed workers: the port after the rendezvous port
    (``TORCH_PORT_OFFSET``), which must exist and must not be the one Batch reserves."""
    port = rendezvous + TORCH_PORT_OFFSET
    batch_port = env.get("AZ_BATCH_MASTER_NODE", "").partition(":")[2]
    if port > 65535 or str(port) == batch_port:
        why = "is not a TCP port" if port > 65535 else "is Batch's own (AZ_BATCH_MASTER_NODE)"
        raise LaunchError(
            f"rendezvous port {rendezvous}: torch.distributed's store takes the next port, "
            f"{port}, which {why}; set MASTER_PORT or --port to another port"
        )
    return port


def host_list(env: dict[str, str]) -> list[str]:
    return [host.strip() for host in env.get("AZ_BATCH_HOST_LIST", "").split(",") if host.strip()]


def read_batch_environment(
    env: dict[str, str], node_ip: str | None, port: int | None = None
) -> Node:
    """The node's place in the job from Batch's variables; ``node_ip`` overrides detection
    (nodes with several matching addresses, or a simulation on 127.0.0.x); ``port`` is the
    ``--port`` option."""
    missing = [key for key in ("AZ_BATCH_HOST_LIST", "AZ_BATCH_MASTER_NODE") if not env.get(key)]
    if missing:
        raise LaunchError(
            f"{missing[0]} is not set: run as a Batch multi-instance task (or set the "
            f"AZ_BATCH_* variables to simulate one)"
        )
    hosts = host_list(env)
    # Only the IP: the port next to it is Batch's own (see DEFAULT_PORT).
    master_ip = env["AZ_BATCH_MASTER_NODE"].partition(":")[0]
    if master_ip not in hosts:
        raise LaunchError(f"AZ_BATCH_MASTER_NODE={master_ip}: not in AZ_BATCH_HOST_LIST {hosts}")
    if node_ip is None:
        mine = [host for host in hosts if interface_of(host)]
        if len(mine) != 1:
            raise LaunchError(
                f"cannot tell which of AZ_BATCH_HOST_LIST {hosts} is this node "
                f"({len(mine)} match its addresses): pass --node-ip"
            )
        node_ip = mine[0]
    if node_ip not in hosts:
        raise LaunchError(f"node_ip={node_ip}: not in AZ_BATCH_HOST_LIST {hosts}")
    is_master = env.get("AZ_BATCH_IS_CURRENT_NODE_MASTER", "").lower() == "true"
    if is_master != (node_ip == master_ip):
        raise LaunchError(
            f"AZ_BATCH_IS_CURRENT_NODE_MASTER={env.get('AZ_BATCH_IS_CURRENT_NODE_MASTER')} "
            f"disagrees with node {node_ip} and master {master_ip}"
        )
    iface = interface_of(node_ip) or interface_of(node_ip, exact=False)
    if iface is None:
        raise LaunchError(f"node_ip={node_ip}: no network interface of this machine has it")
    port = rendezvous_port(env, port)
    node_id = env.get("AZ_BATCH_NODE_ID", "")
    return Node(hosts, hosts.index(node_ip), master_ip, port, is_master, iface, node_id)
