"""Stage from Azurite and SIGKILL itself mid-transfer: after the Nth shard's bytes are on disk
under their temporary name, before the rename (the worst moment for a crash)."""

import os
import signal
import sys
from pathlib import Path

from azure.storage.blob import ContainerClient

from trainer.data import transfer

connection, container_name, prefix, dest, kill_after = sys.argv[1:6]
synced = 0
real_fsync = os.fsync


def fsync_then_die(fd: int) -> None:
    global synced
    real_fsync(fd)
    synced += 1
    if synced == int(kill_after):
        os.kill(os.getpid(), signal.SIGKILL)


transfer.os.fsync = fsync_then_die  # type: ignore[attr-defined]
container = ContainerClient.from_connection_string(connection, container_name)
transfer.stage(container, prefix, Path(dest), parallel=1)
