"""``python -m trainer.launch [options] -- COMMAND...``: the Batch multi-instance task.

Runs on every node of a multi-instance task. From the Batch environment it learns the nodes
(``AZ_BATCH_HOST_LIST``), the master (``AZ_BATCH_MASTER_NODE``, ``ip:port``) and whether it is
the master; the master serves Horovod's Gloo rendezvous on that port, and every node starts one
worker per GPU with the variables ``horovodrun --gloo`` would set. No SSH daemon, keys or
passwords; NCCL carries GPU tensors over InfiniBand with the VM size's settings
(``trainer.fabric``).

Failures end the whole job, never hang it: a launcher whose worker fails records it in the
rendezvous store and stops its workers; every launcher polls the store (and treats a master
that stopped answering as a failure), so all nodes exit non-zero within a few seconds. SIGTERM
(a Batch terminate, a Spot eviction) is forwarded to the workers, which checkpoint and exit 0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import psutil

from trainer.cli import OneLineParser, fail
from trainer.fabric import fabric_for, preflight_floor, worker_environment

POLL_SECONDS = 0.5
MASTER_WAIT_SECONDS = 300
# How long a launcher tolerates an unreachable store before it gives up on the job.
STORE_LOST_SECONDS = 10
KILL_GRACE_SECONDS = 10
DONE_WAIT_SECONDS = 60


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

    @property
    def name(self) -> str:
        return self.hosts[self.index]


def _interface_of(ip: str, *, exact: bool = True) -> str | None:
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


def read_batch_environment(env: dict[str, str], node_ip: str | None) -> Node:
    """The node's place in the job from Batch's variables; ``node_ip`` overrides detection
    (nodes with several matching addresses, or a simulation on 127.0.0.x)."""
    missing = [key for key in ("AZ_BATCH_HOST_LIST", "AZ_BATCH_MASTER_NODE") if not env.get(key)]
    if missing:
        raise LaunchError(
            f"{missing[0]} is not set: run as a Batch multi-instance task (or set the "
            f"AZ_BATCH_* variables to simulate one)"
        )
    hosts = [host.strip() for host in env["AZ_BATCH_HOST_LIST"].split(",") if host.strip()]
    master_ip, _, port_text = env["AZ_BATCH_MASTER_NODE"].partition(":")
    if not port_text.isdigit():
        raise LaunchError(
            f"AZ_BATCH_MASTER_NODE={env['AZ_BATCH_MASTER_NODE']}: expected <ip>:<port>"
        )
    if master_ip not in hosts:
        raise LaunchError(f"AZ_BATCH_MASTER_NODE={master_ip}: not in AZ_BATCH_HOST_LIST {hosts}")
    if node_ip is None:
        mine = [host for host in hosts if _interface_of(host)]
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
    iface = _interface_of(node_ip) or _interface_of(node_ip, exact=False)
    if iface is None:
        raise LaunchError(f"node_ip={node_ip}: no network interface of this machine has it")
    return Node(hosts, hosts.index(node_ip), master_ip, int(port_text), is_master, iface)


class Store:
    """The launchers' keys in the rendezvous server (scope ``launcher``)."""

    def __init__(self, master_ip: str, port: int) -> None:
        self.base = f"http://{master_ip}:{port}/launcher"

    def put(self, key: str, value: str) -> None:
        request = urllib.request.Request(f"{self.base}/{key}", value.encode(), method="PUT")
        urllib.request.urlopen(request, timeout=5).close()

    def get(self, key: str) -> str | None:
        """The value, None when absent; raises OSError when the store is unreachable."""
        try:
            with urllib.request.urlopen(f"{self.base}/{key}", timeout=5) as response:
                return response.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def wait_until_up(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.get("probe")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"the master's rendezvous at {self.base} did not answer in "
                        f"{seconds:g} s: check the master node's task output"
                    ) from None
                time.sleep(1)


class Workers:
    """This node's worker processes, each in its own session so a kill reaches its children."""

    def __init__(self, command: list[str], envs: list[dict[str, str]]) -> None:
        self.processes = [
            subprocess.Popen(command, env=env, start_new_session=True) for env in envs
        ]

    def signal(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    def failed(self) -> tuple[int, int] | None:
        """(local rank, exit code) of the first worker that exited non-zero."""
        for local, process in enumerate(self.processes):
            code = process.poll()
            if code not in (None, 0):
                return local, code
        return None

    def all_done(self) -> bool:
        return all(process.poll() == 0 for process in self.processes)

    def stop(self, grace: float) -> None:
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in self.processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.signal(signal.SIGKILL)
        for process in self.processes:
            process.wait()


def _say(node: Node, message: str) -> None:
    print(f"[launch {node.name}] {message}", file=sys.stderr, flush=True)


def supervise(node: Node, workers: Workers, store: Store) -> int:
    """Wait for the workers; end everything on the first failure anywhere. Returns the exit code."""
    terminating = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal terminating
        terminating = True
        _say(node, f"signal {signum}: forwarding to the workers so they checkpoint")
        workers.signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    store_lost_since: float | None = None
    while True:
        failure = workers.failed()
        if failure:
            local, code = failure
            reason = f"node {node.name} worker {local} exited with {code}"
            _say(node, f"{reason}: stopping the job on every node")
            # If the store is gone too, the others notice that the master stopped answering.
            with contextlib.suppress(OSError):
                store.put("failed", reason)
            workers.stop(KILL_GRACE_SECONDS)
            return code if code > 0 else 1
        if workers.all_done():
            store.put(f"done-{node.index}", "0")
            return 0
        try:
            reason = store.get("failed")
            store_lost_since = None
        except OSError:
            reason = None
            store_lost_since = store_lost_since or time.monotonic()
            if time.monotonic() - store_lost_since > STORE_LOST_SECONDS and not terminating:
                reason = f"the master node {node.master_ip} stopped answering"
        if reason:
            _say(node, f"{reason}: stopping this node's workers")
            workers.stop(KILL_GRACE_SECONDS if terminating else 2)
            return 1
        time.sleep(POLL_SECONDS)


def _wait_for_other_nodes(node: Node, store: Store) -> None:
    """The master keeps the rendezvous up until every node reported (or a minute passed)."""
    deadline = time.monotonic() + DONE_WAIT_SECONDS
    pending = set(range(len(node.hosts))) - {node.index}
    while pending and time.monotonic() < deadline:
        pending = {i for i in pending if store.get(f"done-{i}") is None and not store.get("failed")}
        time.sleep(POLL_SECONDS)


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m trainer.launch",
        description="Start this node's Horovod workers for a Batch multi-instance task.",
        allow_abbrev=False,
    )
    parser.add_argument("--vm-size", help="pool VM size: InfiniBand/NCCL settings and preflight")
    parser.add_argument(
        "--workers-per-node", type=int, help="default: the VM size's GPUs, else visible GPUs or 1"
    )
    parser.add_argument("--node-ip", help="this node's address in AZ_BATCH_HOST_LIST")
    parser.add_argument("command", nargs="+", help="the worker command, after --")
    return parser


def _default_workers(vm_size: str | None) -> int:
    if vm_size:
        return fabric_for(vm_size).gpus
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.vm_size:
            fabric_for(args.vm_size)  # validate before anything starts
        slots = args.workers_per_node or _default_workers(args.vm_size)
        if slots < 1:
            raise LaunchError(f"workers_per_node={slots}: must be at least 1")
        node = read_batch_environment(dict(os.environ), args.node_ip)
    except (LaunchError, ValueError) as err:
        fail(str(err), 2)
    # Imported late: --help and input errors never wait for Horovod.
    from trainer.distributed import gloo_worker_env, start_gloo_rendezvous

    store = Store(node.master_ip, node.port)
    stop_server = None
    if node.is_master:
        try:
            stop_server = start_gloo_rendezvous(node.port, node.hosts, slots)
        except OSError as err:
            fail(f"cannot serve the rendezvous on port {node.port}: {err.strerror}", 1)
    try:
        store.wait_until_up(MASTER_WAIT_SECONDS)
    except LaunchError as err:
        fail(str(err), 1)
    command = list(args.command)
    if args.vm_size and "--preflight-min-busbw" not in command:
        command += ["--preflight-min-busbw", str(preflight_floor(args.vm_size))]
    base = worker_environment(args.vm_size, dict(os.environ))
    envs = [
        {
            **base,
            **gloo_worker_env(
                node.master_ip, node.port, node.iface, node.hosts, node.index, slots, local
            ),
        }
        for local in range(slots)
    ]
    _say(node, f"node {node.index + 1}/{len(node.hosts)}: starting {slots} worker(s)")
    workers = Workers(command, envs)
    code = supervise(node, workers, store)
    if stop_server is not None:
        if code == 0:
            _wait_for_other_nodes(node, store)
        stop_server()
    return code


if __name__ == "__main__":
    sys.exit(main())
