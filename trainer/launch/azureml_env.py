"""Where this node stands in an AzureML command job: the launcher as the one process per node of
a PyTorch distribution (``process_count_per_instance: 1``), which AzureML starts on each node
with the master's address and port, the node count and this node's rank. Pure reading of the
environment, as ``batch_env`` is for Batch: it starts nothing.

Read 2026-11-29 (MicrosoftDocs/azure-ai-docs, articles/machine-learning/
how-to-train-distributed-gpu.md): AzureML sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
NODE_RANK for each node, and RANK and LOCAL_RANK for each process; WORLD_SIZE counts processes,
so with one per node it counts nodes. It names no other node: the nodes are named here by their
rank, the master (rank 0) by its address. No folder is shared between the nodes: the token that
keeps the rendezvous to this launch goes through the job's Blob folder (``token_blob``)."""

from __future__ import annotations

import socket

from trainer.common.errors import one_line
from trainer.launch.batch_env import LaunchError, Node, interface_of, rendezvous_port

REQUIRED = ("MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")
ONE_PER_NODE = (
    "AzureML started more than one launcher on this node: give the job's PyTorch distribution "
    "process_count_per_instance: 1 (the launcher starts the node's workers)"
)


def _count(env: dict[str, str], key: str) -> int:
    text = env[key]
    if not (text.isascii() and text.isdigit()):
        raise LaunchError(f"{key}={one_line(text)}: expected a whole number")
    return int(text)


def _address(name: str) -> str:
    """MASTER_ADDR as an IPv4 address (AzureML may give a host name)."""
    try:
        return socket.gethostbyname(name)
    except OSError as err:
        raise LaunchError(f"MASTER_ADDR={one_line(name)}: cannot resolve it ({err})") from None


def _route_to(master_ip: str) -> str:
    """This machine's address on the way to the master (a UDP socket's source: nothing sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((master_ip, 9))
        except OSError as err:
            raise LaunchError(
                f"MASTER_ADDR={master_ip}: no route to it from this node ({err.strerror})"
            ) from None
        return probe.getsockname()[0]


def node_name(index: int, master_ip: str) -> str:
    """How the job names node ``index``: the master by its address, the others by rank (the
    same on every node: Horovod's rendezvous places workers by these names)."""
    return master_ip if index == 0 else f"node-{index}"


def read_azureml_environment(
    env: dict[str, str], node_ip: str | None, port: int | None = None
) -> Node:
    """This node's place in the job; ``node_ip`` overrides detection (a simulation on
    127.0.0.x); ``port`` is ``--port``."""
    missing = [key for key in REQUIRED if not env.get(key)]
    if missing:
        raise LaunchError(
            f"{missing[0]} is not set: run as an AzureML command job with a PyTorch "
            "distribution (or set its variables to simulate one)"
        )
    nodes, index = _count(env, "WORLD_SIZE"), _count(env, "NODE_RANK")
    if not 0 <= index < nodes:
        raise LaunchError(f"NODE_RANK={index}: not a rank of WORLD_SIZE={nodes} nodes")
    if env.get("LOCAL_RANK", "0") != "0" or env.get("RANK", str(index)) != str(index):
        raise LaunchError(
            f"RANK={env.get('RANK')} LOCAL_RANK={env.get('LOCAL_RANK')}: {ONE_PER_NODE}"
        )
    master_ip = _address(env["MASTER_ADDR"])
    own = node_ip or (master_ip if index == 0 else _route_to(master_ip))
    iface = interface_of(own) or interface_of(own, exact=False)
    if iface is None:
        raise LaunchError(f"node_ip={own}: no network interface of this machine has it")
    hosts = [node_name(i, master_ip) for i in range(nodes)]
    return Node(
        hosts, index, master_ip, rendezvous_port(env, port), index == 0, iface,
        node_id="" if index == 0 else own,
    )  # fmt: skip
