"""The emulated VNet: one Linux network namespace per Batch node, joined by a bridge.

Each node is a separate host as far as the network goes: its own ``eth0`` with a private
address from the stack's compute subnet, its own loopback, its own port space (so a port held by
Batch on the master node is held there only) and its own IMDS address (169.254.169.254). The
bridge lives in a namespace of its own, which also holds the storage endpoint (Azurite). Nothing
is added to the test machine's own network: every interface is created inside a namespace this
module creates, and every namespace is deleted on close, failure included.

Where namespaces cannot be created (no root, no ``ip netns``), nodes fall back to 127.0.0.x on
the machine's loopback; that is not a separate host (one port space, one /sys), so the fixture
says so loudly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass, field

import psutil

from tests.support.process_tree import running

IMDS_IP = "169.254.169.254"


class VNetUnavailable(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise VNetUnavailable(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _pids_in(ns: str) -> list[int]:
    """The processes whose network namespace is ``ns`` (none once it is gone)."""
    return [int(pid) for pid in _ip("netns", "pids", ns, check=False).stdout.split()]


_VNETS = itertools.count()


@dataclass
class VNet:
    """``nodes`` hosts on ``subnet`` (addresses from .4 on, as Azure assigns them) and a storage
    endpoint; ``exec_prefix(ns)`` runs a command inside a namespace."""

    nodes: int
    subnet: str
    # Unique per VNet, not only per process: the emulator's session VNet and a test's own
    # (the preflight's nodes) live side by side in one pytest process.
    prefix: str = field(default_factory=lambda: f"bx{os.getpid()}-{next(_VNETS)}")
    isolated: bool = True
    node_ips: list[str] = field(default_factory=list)
    storage_ip: str = ""
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        network = ipaddress.ip_network(self.subnet)
        hosts = list(network.hosts())
        self.node_ips = [str(hosts[3 + i]) for i in range(self.nodes)]  # .4, .5, ...
        self.storage_ip = str(hosts[-2])
        self.prefix_len = network.prefixlen
        try:
            self._create()
        except (VNetUnavailable, FileNotFoundError, PermissionError) as err:
            self.close()
            self._fallback(str(err))

    # --- namespaces --------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def node_ns(self, index: int) -> str:
        return f"{self.prefix}-n{index}"

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _create(self) -> None:
        if os.geteuid() != 0:
            raise VNetUnavailable("network namespaces need root")
        self._add_ns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "addr", "add", f"{self.storage_ip}/{self.prefix_len}", "dev", "br0")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for index, address in enumerate(self.node_ips):
            ns = self.node_ns(index)
            self._add_ns(ns)
            port = f"p{index}"
            # Both ends are created inside namespaces: nothing touches the machine's network.
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/{self.prefix_len}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            # The Azure instance metadata service address, answered by the node's own IMDS.
            _ip("-n", ns, "addr", "add", f"{IMDS_IP}/32", "dev", "lo")
        self._wait_for_links()

    def _wait_for_links(self) -> None:
        deadline = time.monotonic() + 10
        for index in range(self.nodes):
            while "state UP" not in _ip("-n", self.node_ns(index), "link", "show", "eth0").stdout:
                if time.monotonic() > deadline:
                    raise VNetUnavailable(f"eth0 of {self.node_ns(index)} never came up")
                time.sleep(0.05)

    def _fallback(self, reason: str) -> None:
        self.isolated = False
        self.namespaces = []
        self.node_ips = [f"127.0.0.{2 + i}" for i in range(self.nodes)]
        self.storage_ip = "127.0.0.1"
        message = (
            f"BATCH EMULATOR: network namespaces unavailable ({reason}); nodes share this "
            f"machine's loopback as {', '.join(self.node_ips)}: NOT separate hosts (one port "
            f"space, one IMDS, no per-node interface)"
        )
        warnings.warn(message, stacklevel=2)
        print(f"\nWARNING: {message}", flush=True)

    def exec_prefix(self, ns: str | None) -> list[str]:
        if not self.isolated or ns is None:
            return []
        return ["ip", "netns", "exec", ns]

    def node_processes(self) -> list[psutil.Process]:
        """What runs in the nodes' network namespaces (a container with a network namespace
        of its own is not counted); nothing once a cluster closed."""
        if not self.isolated:
            return []
        return running(pid for index in range(self.nodes) for pid in _pids_in(self.node_ns(index)))

    def close(self) -> None:
        """Kill what still runs in our namespaces, then delete them (veths go with them)."""
        for ns in reversed(self.namespaces):
            for pid in _pids_in(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces = []
