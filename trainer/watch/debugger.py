"""``--debug-rank R --debug-port P``: rank R waits for a debugger (debugpy) before training
while every other rank waits at a barrier (docs/trainer.md, "Debugging one rank")."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from trainer.common.errors import ConfigError, first_line
from trainer.settings.train_config import TrainConfig

if TYPE_CHECKING:
    from trainer.engines.base import Dist
    from trainer.watch.signals import StopRequest

log = logging.getLogger(__name__)

# How long rank R waits for a client to attach before every rank stops: a pool must not sit
# idle, and billed, for hours because nobody came.
ATTACH_TIMEOUT_MINUTES = 60
# How often the waiting rank joins the barrier's round (each round is a collective). Short
# rounds, not one long collective: a human may take longer than the engines' collective
# timeouts (torch.distributed fails a collective that waits over 30 minutes by default, 10 with
# NCCL; Horovod logs a stall warning every minute), while a round of seconds times out on none.
POLL_SECONDS = 5.0
# What rank R tells the other ranks each round.
WAITING, ATTACHED, GAVE_UP = "waiting", "attached", "gave up"


class DebuggerError(RuntimeError):
    """No debugger could attach (exit 1); the message is one line naming the rank and port."""


def wait_for_debugger(cfg: TrainConfig, dist: Dist, stop: StopRequest) -> None:
    """Every rank: return once a debugger has attached to rank ``cfg.debug_rank``, or a rank
    was asked to stop (the first step then checkpoints and ends the run). A collective. Raises
    ConfigError for a rank outside the world, DebuggerError when the rank cannot listen or
    nobody attached in time."""
    rank = cfg.debug_rank
    if rank is None:
        return
    if rank >= dist.size:
        raise ConfigError(
            f"debug_rank={rank}: the run has {dist.size} worker(s), ranks 0..{dist.size - 1}; "
            "pick one of them"
        )
    host = dist.allgather_object(_address())[rank]
    problem = _listen(cfg.debug_port, host) if dist.rank == rank else None
    attached = threading.Event()
    if dist.rank == rank and problem is None:
        threading.Thread(
            target=_wait_for_client, args=(attached,), name="debugger-attach", daemon=True
        ).start()
    _announce(cfg, dist, host, listening=problem is None)
    _hold_until_attached(cfg, dist, stop, attached, problem, host)


def _announce(cfg: TrainConfig, dist: Dist, host: str, listening: bool) -> None:
    rank = cfg.debug_rank
    if dist.rank == rank and listening:
        log.warning(
            "rank %d waits for a debugger on host %s, port %d (Debug Adapter Protocol; nothing "
            "trains until one attaches, at most %d min)",
            rank,
            host,
            cfg.debug_port,
            ATTACH_TIMEOUT_MINUTES,
        )
    elif dist.rank != rank:
        log.warning(
            "rank %d waits at a barrier until the debugger on rank %d (host %s, port %d) attaches",
            dist.rank,
            rank,
            host,
            cfg.debug_port,
        )


def _hold_until_attached(
    cfg: TrainConfig,
    dist: Dist,
    stop: StopRequest,
    attached: threading.Event,
    problem: str | None,
    host: str,
) -> None:
    """The barrier's rounds: rank R says each round whether a client attached, is still awaited
    or will not come; every rank leaves on the same round."""
    rank = cfg.debug_rank
    where = f"rank {rank} (host {host}, port {cfg.debug_port})"
    deadline = time.monotonic() + ATTACH_TIMEOUT_MINUTES * 60
    while True:
        state = None
        if dist.rank == rank:
            if problem is None and attached.wait(POLL_SECONDS):
                state = ATTACHED
            elif problem is None and time.monotonic() < deadline:
                state = WAITING
            else:
                state = GAVE_UP
        states = dist.allgather_object((state, stop.requested))
        state = states[rank][0]
        if any(stopping for _, stopping in states):
            log.warning("rank %d: stop requested while waiting for the debugger", dist.rank)
            return
        if state == ATTACHED:
            if dist.rank == rank:
                log.warning("rank %d: a debugger attached; training starts", rank)
            return
        if state == GAVE_UP:
            if dist.rank != rank:
                raise DebuggerError(
                    f"debug_rank={rank}: no debugger attached to {where} (its log says why); "
                    "stopping too"
                )
            raise DebuggerError(
                problem
                or f"debug_rank={rank}: no debugger attached to {where} within "
                f"{ATTACH_TIMEOUT_MINUTES} min; attach through the tunnel (docs/trainer.md, "
                "'Debugging one rank') sooner, or run without --debug-rank"
            )


def _address() -> str:
    """This node as a tunnel names it (``ssh -L``): ``name/private address``, or the name alone
    where it resolves only to loopback or not at all."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return name
    return name if address.startswith("127.") else f"{name}/{address}"


def _listen(port: int, host: str) -> str | None:
    """Start debugpy on ``port``; None, or the one-line reason it could not."""
    # pydevd's check for frozen standard-library modules prints four lines on every start;
    # breakpoints in the trainer's own code are not affected by it.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import debugpy

    try:
        # Every interface, not loopback: the client's tunnel ends at the jump host in the VNet,
        # which connects to this node's private address.
        debugpy.listen(("0.0.0.0", port))
    except Exception as err:  # debugpy raises RuntimeError, or OSError from its adapter
        return (
            f"debug_port={port}: cannot listen on host {host} ({first_line(err)}); pick a "
            "free port with --debug-port"
        )
    return None


def _wait_for_client(attached: threading.Event) -> None:
    import debugpy

    debugpy.wait_for_client()
    attached.set()
