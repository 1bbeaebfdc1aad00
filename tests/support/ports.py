"""Free TCP ports for the servers a test starts, chosen outside the kernel's ephemeral range.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the same range it draws every outgoing
connection's source port from. Once the probe socket closes, a Gloo or HTTP client of the same
test can take that port, or the one after it that the launcher gives torch.distributed's store,
before the server binds it; a run then fails with "address already in use" only now and then.
Ports below the ephemeral range are never given to outgoing connections, so a port that binds
free here stays free until a server of this test takes it.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _binds(port: int) -> bool:
    # Without SO_REUSEADDR a port still held in TIME_WAIT counts as taken too.
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def free_port(consecutive: int = 1) -> int:
    """A port that binds now, below the ephemeral range; with ``consecutive`` > 1, the first of
    that many free ports in a row (the launcher's store and torch.distributed's, the next one)."""
    top = min(_ephemeral_start(), 65536) - consecutive
    for _ in range(1000):
        port = random.randrange(20000, top)
        if all(_binds(port + offset) for offset in range(consecutive)):
            return port
    raise RuntimeError(f"no {consecutive} free port(s) in a row in 20000-{top}")
