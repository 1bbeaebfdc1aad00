"""``python -m trainer.launch [options] -- COMMAND...``: the Batch multi-instance task.

Runs on every node of a multi-instance task. From the Batch environment it learns the nodes
(``AZ_BATCH_HOST_LIST``), the master's address (the IP of ``AZ_BATCH_MASTER_NODE``) and whether
it is the master; the master serves Horovod's Gloo rendezvous on ``MASTER_PORT`` (default 6105,
or ``--port``), which also holds the launchers' own keys, and every node starts one worker per
GPU (one on a size without GPUs). The worker command's engine (its ``--backend``, read as the
trainer reads it: ``engine_of``) decides their variables: for Horovod those ``horovodrun --gloo``
would set; for a torch.distributed engine (ddp, fsdp) those ``torchrun`` would set, with
``MASTER_PORT`` the rendezvous port + 1 (``torch_master_port``). No SSH daemon, keys or
passwords; NCCL carries GPU tensors over InfiniBand with the VM size's settings
(``trainer.launch.fabric``). The worker command runs as given: the job (``infra/job.py``) builds
it complete, the engine and the size's preflight floor included.

Failures end the whole job, never hang it: a launcher whose worker fails records it in the
rendezvous store and stops its workers; every launcher polls the store (and treats a master
that stopped answering as a failure), so all nodes exit non-zero within a few seconds. SIGTERM
(a Batch terminate, a Spot eviction) is forwarded to the workers, which checkpoint and exit 0.
With ``--watch-scheduled-events`` a notice for this VM does the same; the launcher then approves
the event if it takes only this job's VMs (``StoreVms``) and waits for the platform to take the
VM (``HOLD_SECONDS``), so that Batch requeues the task without counting a retry.

Records: when the worker command has ``--output-dir``, that folder (on the shared file system)
gets ``logs/<attempt>/launch-<node>.log`` (everything this launcher and its workers printed)
and ``logs/<attempt>/outcome-<node>.json``; the master names the attempt (a new id on every
start, so a retry never reads an earlier attempt's files) in ``logs/current.json``. On Batch,
every node runs the launcher in the foreground of the coordination command with
``--defer-exit-code`` (exit 0 once the outcome is recorded), and the application command,
which Batch runs on the primary only after every coordination command returned, runs it with
``--report``: print every node's log, exit with the recorded outcome.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil
import yaml

from trainer.cli import OneLineParser, fail
from trainer.cli import build_parser as trainer_parser
from trainer.config import DEFAULTS, TORCH_DISTRIBUTED_BACKENDS, one_line
from trainer.files import ensure_writable_folder, write_atomic
from trainer.launch.fabric import fabric_for, worker_environment, workers_per_node
from trainer.launch.rendezvous import (
    gloo_worker_env,
    job_segment,
    new_token,
    publish_token,
    read_token,
    start_gloo_rendezvous,
    torch_worker_env,
)
from trainer.launch.stop import STOP
from trainer.launch.task_user import task_user_environment
from trainer.scheduled_events import IMDS, ScheduledEvents, Watcher

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
# The engines the launcher starts: Horovod, and those started the way torchrun starts them.
# (``local`` is one process without a process group: nothing to launch on several nodes.)
LAUNCHED_BACKENDS = ("horovod", *TORCH_DISTRIBUTED_BACKENDS)
POLL_SECONDS = 0.5
MASTER_WAIT_SECONDS = 300
# The report's exit code when the workers were stopped by a signal (and checkpointed): the run
# is not finished, so the task must not count as succeeded (Batch retries it, which resumes).
INTERRUPTED_EXIT = 75
# How long a launcher tolerates an unreachable store before it gives up on the job.
STORE_LOST_SECONDS = 10
KILL_GRACE_SECONDS = 10
DONE_WAIT_SECONDS = 60
# How long a file another node wrote may stay invisible to this one on the shared file system:
# the NFS client trusts cached lookups, negative ones too, until the folder's cached attributes
# expire, at most acdirmax, 60 s by default (nfs(5), "Directory entry caching", lookupcache=all);
# the pools mount with none of ac/actimeo/acdirmax/lookupcache set (infra/nfs.py), so a reader
# opens such a file by name again until this passed (the lookup then reaches the server).
NFS_CACHE_SECONDS = 60
# After a scheduled event's checkpoint the launcher of the VM it takes does not exit: Batch counts
# a non-zero exit as a retry of the task (maxTaskRetryCount, infra/batch.py), while a task whose
# node is rebooted or disappears is retried by Batch's recovery, "independent of and ... not
# counted against the maxTaskRetryCount" (the Batch REST spec, TaskAddParameter), and a Spot
# node's preemption requeues its tasks (articles/batch/batch-spot-vms.md). So the launcher waits
# for the platform to take the VM: at most this long (the longest minimum notice of an event
# that takes the VM, a Reboot's 15 minutes, and five more), or until the event ends without
# taking it (cancelled): then it exits, which costs a retry.
HOLD_SECONDS = 20 * 60

_T = TypeVar("_T")


class LaunchError(RuntimeError):
    """The Batch environment or the options cannot start a run; one line for the user."""


class Stopped(Exception):
    """A SIGTERM/SIGINT came while the launcher waited for the other nodes (``STOP``)."""


def _check_stop() -> None:
    if STOP.requested:
        raise Stopped(f"signal {STOP.signum}")


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
    port = rendezvous_port(env, port)
    return Node(hosts, hosts.index(node_ip), master_ip, port, is_master, iface)


class Store:
    """The launchers' keys in the rendezvous server (scope ``launcher``), behind the job's
    token (``trainer.launch.rendezvous``)."""

    def __init__(self, master_ip: str, port: int, token: str) -> None:
        self.token = token
        self.base = f"http://{master_ip}:{port}/{job_segment(token, port)}/launcher"
        # What messages name: the token stays out of logs.
        self.address = f"http://{master_ip}:{port}"

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

    def wait_for(self, key: str, seconds: float) -> str:
        """The value of ``key`` once some launcher put it."""
        deadline = time.monotonic() + seconds
        while (value := self.get(key)) is None:
            _check_stop()
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the master did not publish {key!r} at {self.address} in {seconds:g} s: "
                    "check the master node's task output"
                )
            time.sleep(POLL_SECONDS)
        return value

    def answers(self) -> bool:
        """Whether the master's store is up and takes this token."""
        try:
            self.get("probe")
            return True
        except OSError:  # not up yet, or (an HTTPError 403) another launch's token
            return False


def join_store(
    node: Node, token_of: Callable[[], str | None], seconds: float, sleep: float = 1
) -> Store:
    """The master's store, once it answers to the token ``token_of`` returns (None: not
    published yet). Asked again on every try: a node may read an earlier launch's token before
    the master replaced it, which the master's store refuses."""
    deadline = time.monotonic() + seconds
    while True:
        _check_stop()
        token = token_of()
        if token is not None:
            store = Store(node.master_ip, node.port, token)
            if store.answers():
                return store
        if time.monotonic() > deadline:
            raise LaunchError(
                f"the master's rendezvous at http://{node.master_ip}:{node.port} did not "
                f"answer to this launch's token in {seconds:g} s: check the master node's "
                "task output"
            )
        time.sleep(sleep)


class StoreVms:
    """The VM names of this job's nodes (``trainer.scheduled_events.JobVms``), exchanged through
    the launchers' store: each launcher puts the name its metadata service gives
    (``vm-<index>``); the watcher reads them all when an event comes. Batch tells a node the
    others' addresses (``AZ_BATCH_HOST_LIST``), not their VM names, which Scheduled Events
    lists; asking Batch's API for them would need a credential on the node. A node that has not
    published (yet) is missing, so an event naming its VM is not approved."""

    def __init__(self, store: Store, nodes: int, index: int) -> None:
        self.store, self.nodes, self.index = store, nodes, index

    def publish(self, vm_name: str) -> None:
        self.store.put(f"vm-{self.index}", vm_name)

    def names(self) -> set[str]:
        return {name for i in range(self.nodes) if (name := self.store.get(f"vm-{i}"))}


class RunLog:
    """Everything this launcher prints: to its own stdout/stderr (the task's output files) and,
    once the attempt is known, into the run folder on the shared file system, where the
    primary's ``--report`` finds the logs of every node."""

    def __init__(self, name: str, *, keep_early: bool) -> None:
        self.name = name
        # Reentrant: the SIGTERM handler logs from the main thread, which may hold it already.
        self._lock = threading.RLock()
        self._file: IO[str] | None = None
        self._early: list[str] | None = [] if keep_early else None

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed by close()
        with self._lock:
            file.write("".join(self._early or []))
            file.flush()
            self._file, self._early = file, None

    def write(self, text: str, stream: IO[str]) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()
            if self._file is not None:
                with contextlib.suppress(OSError):  # a full share must not stop training
                    self._file.write(text)
                    self._file.flush()
            elif self._early is not None:
                self._early.append(text)

    def say(self, message: str) -> None:
        self.write(f"[launch {self.name}] {message}\n", sys.stderr)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


class Workers:
    """This node's worker processes, each in its own session so a kill reaches its children;
    their output goes through ``log``."""

    def __init__(self, command: list[str], envs: list[dict[str, str]], log: RunLog) -> None:
        self.processes = [
            subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for env in envs
        ]
        self._pumps = [
            threading.Thread(target=_pump, args=(process.stdout, log), daemon=True)
            for process in self.processes
        ]
        for pump in self._pumps:
            pump.start()

    def join_output(self, seconds: float = 5) -> None:
        """Let the output threads copy what the exited workers left in their pipes."""
        deadline = time.monotonic() + seconds
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))

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


def _pump(stream: IO[bytes], log: RunLog) -> None:
    for line in iter(stream.readline, b""):
        log.write(line.decode("utf-8", errors="replace"), sys.stdout)
    stream.close()


@dataclass(frozen=True)
class Outcome:
    """How this node's part of the run ended, as recorded for the report."""

    code: int
    reason: str
    interrupted: bool = False


def supervise(
    node: Node, workers: Workers, store: Store, log: RunLog, watcher: Watcher | None = None
) -> Outcome:
    """Wait for the workers; end everything on the first failure anywhere. A signal (a Batch
    terminate) or a scheduled event on this VM (a Spot eviction, maintenance) makes the workers
    checkpoint and stop; the trainer stops every rank at the same step."""
    terminating = False

    def forward(signum: int) -> None:
        nonlocal terminating
        terminating = True
        log.say(f"signal {signum}: forwarding to the workers so they checkpoint")
        workers.signal(signal.SIGTERM)

    # A signal that came while the workers started is forwarded now (trainer.launch.stop).
    STOP.forward_to(forward)
    store_lost_since: float | None = None
    while True:
        if watcher is not None and watcher.noticed and not terminating:
            terminating = True
            notice = ", ".join(
                f"{e.event_type} {e.event_id} ({e.not_before})" for e in watcher.events
            )
            log.say(f"scheduled event {notice}: the workers checkpoint now")
            workers.signal(signal.SIGTERM)
        failure = workers.failed()
        if failure:
            local, code = failure
            reason = f"node {node.name} worker {local} exited with {code}"
            log.say(f"{reason}: stopping the job on every node")
            # If the store is gone too, the others notice that the master stopped answering.
            with contextlib.suppress(OSError):
                store.put("failed", reason)
            workers.stop(KILL_GRACE_SECONDS)
            return Outcome(code if code > 0 else 1, reason)
        if workers.all_done():
            with contextlib.suppress(OSError):  # the master may be gone once all are done
                store.put(f"done-{node.index}", "0")
            if terminating:
                return Outcome(0, "stopped by a signal; the workers checkpointed", True)
            return Outcome(0, f"node {node.name}: every worker finished")
        try:
            reason = store.get("failed")
            store_lost_since = None
        except OSError:
            reason = None
            store_lost_since = store_lost_since or time.monotonic()
            if time.monotonic() - store_lost_since > STORE_LOST_SECONDS and not terminating:
                reason = f"the master node {node.master_ip} stopped answering"
        if reason:
            log.say(f"{reason}: stopping this node's workers")
            workers.stop(KILL_GRACE_SECONDS if terminating else 2)
            return Outcome(1, reason, terminating)
        time.sleep(POLL_SECONDS)


def _wait_for_other_nodes(node: Node, store: Store) -> None:
    """The master keeps the rendezvous up until every node reported (or a minute passed)."""
    deadline = time.monotonic() + DONE_WAIT_SECONDS
    pending = set(range(len(node.hosts))) - {node.index}
    while pending and time.monotonic() < deadline:
        pending = {i for i in pending if store.get(f"done-{i}") is None and not store.get("failed")}
        time.sleep(POLL_SECONDS)


def output_dir_of(command: list[str]) -> Path | None:
    """The worker command's ``--output-dir`` (the last one, as argparse takes it)."""
    found = None
    for index, word in enumerate(command):
        if word == "--output-dir" and index + 1 < len(command):
            found = command[index + 1]
        elif word.startswith("--output-dir="):
            found = word.partition("=")[2]
    return Path(found) if found else None


def engine_of(command: list[str]) -> str:
    """The engine the worker command trains on, read as the trainer reads it (its own parser,
    so ``--backend X``, ``--backend=X``, the last one winning): the flag, else the ``backend``
    of its ``--config`` file, else the trainer's default. A command that is not the trainer
    (a test's stand-in, a script) has no ``--backend`` and gets the default, Horovod's
    variables, as it always has. The job (``infra/batch.py``) always writes ``--backend``."""
    # --help would make the parser print and exit: the worker answers it, not the launcher.
    words = [word for word in command if word not in ("-h", "--help")]
    known = vars(trainer_parser().parse_known_args(words)[0])
    backend = known.get("backend")
    if backend is None and known.get("config") is not None:
        path = known["config"]
        try:
            values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            reason = getattr(err, "strerror", None) or type(err).__name__
            raise LaunchError(
                f"config={path}: cannot read the worker's settings ({reason})"
            ) from None
        if isinstance(values, dict) and values.get("backend") is not None:
            backend = str(values["backend"])
    backend = backend or DEFAULTS.backend
    if backend not in LAUNCHED_BACKENDS:
        hint = " (local is one process: run dt-train without the launcher)"
        raise LaunchError(
            f"backend={backend}: the launcher starts {', '.join(LAUNCHED_BACKENDS)} workers on "
            f"every node; choose one of them{hint if backend == 'local' else ''}"
        )
    return backend


def worker_envs(
    engine: str,
    node: Node,
    slots: int,
    base: dict[str, str],
    torch_port: int | None = None,
    *,
    token: str,
) -> list[dict[str, str]]:
    """Each of this node's ``slots`` workers' environment: ``base`` (the inherited one with the
    VM size's fabric settings) and the engine's rendezvous variables, ``torch_port`` being
    ``MASTER_PORT`` for a torch.distributed engine (``torch_master_port``) and ``token`` the
    job's, which Horovod's workers send to the master's store."""
    nodes = len(node.hosts)
    if engine in TORCH_DISTRIBUTED_BACKENDS:
        if torch_port is None:
            raise ValueError(f"backend={engine}: needs torch_port")
        return [
            {
                **base,
                **torch_worker_env(
                    node.master_ip, torch_port, node.iface, nodes, node.index, slots, local
                ),
            }
            for local in range(slots)
        ]
    return [
        {
            **base,
            **gloo_worker_env(
                node.master_ip, node.port, token, node.iface, node.hosts, node.index, slots, local
            ),
        }
        for local in range(slots)
    ]


def check_writable(folder: Path) -> None:
    """Fail before any worker starts when the run folder cannot be created or written: on
    Batch the task runs as a non-admin user, which an NFS export owned by root refuses."""
    try:
        ensure_writable_folder(folder)
    except OSError as err:
        raise LaunchError(
            f"output_dir={folder}: cannot create or write it as uid {os.getuid()} "
            f"({err.strerror or err}): make the runs folder on the share writable for the "
            "task's user (e.g. chmod 1777 on the export's runs/ folder), or pass another "
            "--output-dir"
        ) from None


class RunRecords:
    """``<output-dir>/logs``: each attempt's launcher logs and outcomes, and which attempt is
    the current one."""

    def __init__(self, output_dir: Path) -> None:
        self.root = output_dir / "logs"
        self.current = self.root / "current.json"
        # The master's token for the other nodes: the run folder is on the file system every
        # node of the pool mounts, which a host elsewhere on the VNet cannot read.
        self.token = self.root / "rendezvous.token"

    def publish_token(self, token: str) -> None:
        publish_token(self.token, token)  # readable by the other nodes' uids (rendezvous.py)

    def read_token(self) -> str | None:
        """The token the master published, None until it did (or while it cannot be read)."""
        return read_token(self.token)

    @staticmethod
    def new_attempt() -> str:
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)

    def log_path(self, attempt: str, host: str) -> Path:
        return self.root / attempt / f"launch-{host}.log"

    def outcome_path(self, attempt: str, host: str) -> Path:
        return self.root / attempt / f"outcome-{host}.json"

    def start(self, attempt: str, hosts: list[str], env: dict[str, str]) -> None:
        (self.root / attempt).mkdir(parents=True, exist_ok=True)
        record = {"attempt": attempt, "hosts": hosts, "job": env.get("AZ_BATCH_JOB_ID")}
        write_atomic(self.current, json.dumps(record).encode())

    def finish(self, attempt: str, host: str, outcome: Outcome) -> None:
        record = {"attempt": attempt, "host": host, **asdict(outcome)}
        write_atomic(self.outcome_path(attempt, host), json.dumps(record).encode())

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise LaunchError(f"{path}: cannot read it ({err})") from None

    @staticmethod
    def _log(path: Path) -> str | None:
        """A node's log, None while this node cannot see it; an error's message in its place."""
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"(no log: {err.strerror})\n"

    def report(
        self,
        env: dict[str, str],
        out: IO[str],
        wait: float = NFS_CACHE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Print every node's log of the current attempt; the exit code of its outcome. The
        other nodes wrote their logs and outcomes, which this node may not see yet
        (``NFS_CACHE_SECONDS``): each is opened by name again until it is there or ``wait``
        seconds passed, so a node whose launcher died costs the report that long."""
        current = self._read(self.current)
        if current is None:
            raise LaunchError(
                f"{self.current} is missing: no launcher recorded a run in {self.root} "
                "(the coordination command must run trainer.launch; see each node's output)"
            )
        attempt, hosts = current["attempt"], current["hosts"]
        # Defence in depth: Batch runs this only after this attempt's master rewrote the file.
        expected = {"hosts": host_list(env), "job": env.get("AZ_BATCH_JOB_ID")}
        for key, value in expected.items():
            if value and current.get(key) != value:
                raise LaunchError(
                    f"{self.current}: records {key} {current.get(key)}, not this task's "
                    f"{value}: a stale record; run the task again"
                )
        failures: list[tuple[int, str]] = []
        interrupted = False
        deadline = time.monotonic() + wait
        for index, host in enumerate(hosts):
            log_path = self.log_path(attempt, host)
            out.write(f"===== node {index + 1}/{len(hosts)} {host}: {log_path} =====\n")
            outcome_path = self.outcome_path(attempt, host)
            outcome = _until_seen(lambda p=outcome_path: self._read(p), deadline, sleep)
            text = _until_seen(lambda p=log_path: self._log(p), deadline, sleep)
            out.write("(no log: No such file or directory)\n" if text is None else text)
            if outcome is None or outcome.get("attempt") != attempt:
                failures.append((1, f"node {host} recorded no outcome (its launcher died?)"))
            elif outcome["code"] != 0:
                failures.append((int(outcome["code"]), outcome["reason"]))
            interrupted = interrupted or bool(outcome and outcome.get("interrupted"))
        if failures:
            code, reason = failures[0]
            summary = f"attempt {attempt} failed: {reason} (exit {code})"
        elif interrupted:
            code, summary = INTERRUPTED_EXIT, f"attempt {attempt} was stopped by a signal"
        else:
            code, summary = 0, f"attempt {attempt}: every node finished"
        out.write(f"===== {summary}\n")
        out.flush()
        return code


def _until_seen(
    read: Callable[[], _T | None], deadline: float, sleep: Callable[[float], None]
) -> _T | None:
    """What ``read`` returns once it is not None, or None at ``deadline`` (``time.monotonic``)."""
    while (found := read()) is None and time.monotonic() < deadline:
        sleep(POLL_SECONDS)
    return found


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m trainer.launch",
        description="Start this node's workers (Horovod, or torch.distributed: ddp, fsdp) for a "
        "Batch multi-instance task; the worker command's --backend chooses the engine.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--vm-size", help="pool VM size: workers per node and InfiniBand/NCCL settings"
    )
    parser.add_argument(
        "--workers-per-node", type=int, help="default: the VM size's GPUs, else visible GPUs or 1"
    )
    parser.add_argument("--node-ip", help="this node's address in AZ_BATCH_HOST_LIST")
    parser.add_argument(
        "--port",
        type=int,
        help=f"rendezvous port on the master (default: MASTER_PORT, else {DEFAULT_PORT}); never "
        "the port in AZ_BATCH_MASTER_NODE, which Batch reserves. ddp and fsdp workers also use "
        "the next port (torch.distributed's store)",
    )
    parser.add_argument(
        "--watch-scheduled-events",
        action="store_true",
        help="poll the VM's Azure Scheduled Events (AZURE_IMDS_URL, default the metadata "
        "service): on a Spot eviction or maintenance notice the workers checkpoint at once",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--defer-exit-code",
        action="store_true",
        help="exit 0 once the outcome is recorded in <output-dir>/logs (Batch's coordination "
        "command); --report exits with it",
    )
    mode.add_argument(
        "--report",
        action="store_true",
        help="start nothing: print every node's log of the current attempt and exit with its "
        "recorded outcome (Batch's application command)",
    )
    parser.add_argument("command", nargs="+", help="the worker command, after --")
    return parser


def _default_workers(vm_size: str | None) -> int:
    if vm_size:
        return workers_per_node(vm_size)
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


def main(argv: list[str] | None = None) -> int:
    STOP.install()  # `python -m trainer.launch` did already, before its imports
    args = build_parser().parse_args(argv)
    command = list(args.command)
    output_dir = output_dir_of(command)
    env = dict(os.environ)
    if args.report:
        try:
            if output_dir is None:
                raise LaunchError("--report needs the worker command's --output-dir")
            return RunRecords(output_dir).report(env, sys.stdout)
        except LaunchError as err:
            fail(str(err), 1)
    try:
        if args.vm_size:
            fabric_for(args.vm_size)  # validate before anything starts
        # Not `args.workers_per_node or ...`: that would turn an explicit 0 into the default.
        if args.workers_per_node is not None and args.workers_per_node < 1:
            raise LaunchError(
                f"--workers-per-node={args.workers_per_node}: must be at least 1 (one worker "
                "per GPU; leave it out to use the VM size's GPUs)"
            )
        slots = args.workers_per_node or _default_workers(args.vm_size)
        engine = engine_of(command)
        node = read_batch_environment(env, args.node_ip, args.port)
        torch_port = None
        if engine in TORCH_DISTRIBUTED_BACKENDS:
            torch_port = torch_master_port(node.port, env)
        if output_dir is None and args.defer_exit_code:
            raise LaunchError("--defer-exit-code needs the worker command's --output-dir")
        if output_dir is None and len(node.hosts) > 1:
            raise LaunchError(
                f"{len(node.hosts)} nodes in AZ_BATCH_HOST_LIST: the master hands its "
                "rendezvous token to the other nodes in the run folder, so the worker command "
                "needs --output-dir on the file system every node mounts"
            )
        if output_dir is not None:
            check_writable(output_dir)
    except (LaunchError, ValueError) as err:
        fail(str(err), 2)
    records = RunRecords(output_dir) if output_dir is not None else None
    log = RunLog(node.name, keep_early=records is not None)
    stop_server = None
    # Every launch a new token: only this launch's nodes and workers reach the master's store.
    token = new_token() if node.is_master else None
    if token is not None:
        try:
            stop_server = start_gloo_rendezvous(node.port, node.hosts, slots, token, log.say)
        except OSError as err:
            fail(
                f"cannot serve the rendezvous on port {node.port}: {err.strerror}: set "
                "MASTER_PORT or --port to a free port (not the one in AZ_BATCH_MASTER_NODE)",
                1,
            )
    try:
        if token is not None and records is not None and len(node.hosts) > 1:
            records.publish_token(token)
        # The master knows its token; the others read it from the run folder (checked above).
        token_of = records.read_token if token is None and records is not None else lambda: token
        store = join_store(node, token_of, MASTER_WAIT_SECONDS)
        if node.is_master:
            attempt = RunRecords.new_attempt()
            store.put("attempt", attempt)
        else:
            attempt = store.wait_for("attempt", MASTER_WAIT_SECONDS)
        if records is not None:
            log.open(records.log_path(attempt, node.name))
            if node.is_master:
                records.start(attempt, node.hosts, env)
    except LaunchError as err:
        fail(str(err), 1)
    except Stopped as stopped:
        # No attempt to record it under: say so in the task's output and end (the newest
        # checkpoint stays the run's; a retry or the next run resumes from it).
        log.say(f"{stopped} while the nodes met, before the workers started: not starting them")
        if stop_server is not None:
            stop_server()
        log.close()
        return 0 if args.defer_exit_code else INTERRUPTED_EXIT
    except OSError as err:
        fail(f"output_dir={output_dir}: cannot record the run ({err.strerror or err})", 1)
    base = worker_environment(args.vm_size, task_user_environment(env))
    envs = worker_envs(engine, node, slots, base, torch_port, token=store.token)
    if STOP.requested:
        # Nothing to checkpoint yet: the newest checkpoint stays the run's. The master does not
        # wait for the others (they were stopped too; none needs its store any more).
        outcome = Outcome(0, f"signal {STOP.signum} before the workers started", True)
        log.say(f"{outcome.reason}: not starting them")
        ending = _Ending(node, store, records, attempt, log, stop_server)
        return ending.finish(outcome, args.defer_exit_code, wait_for_others=False)
    log.say(
        f"node {node.index + 1}/{len(node.hosts)}: starting {slots} worker(s) (attempt {attempt})"
        + ("" if engine == "horovod" else f", {engine} on {node.master_ip}:{torch_port}")
    )
    workers = Workers(command, envs, log)
    watcher = None
    if args.watch_scheduled_events:
        imds = env.get("AZURE_IMDS_URL", IMDS)
        job_vms = StoreVms(store, len(node.hosts), node.index)
        watcher = Watcher(ScheduledEvents(imds), say=log.say, job=job_vms).start()
    outcome = supervise(node, workers, store, log, watcher)
    workers.join_output()
    if watcher is not None:
        watcher.stop()
        if watcher.noticed:
            _approve(watcher, log)
    ending = _Ending(node, store, records, attempt, log, stop_server)
    hold = watcher if watcher is not None and watcher.noticed else None
    return ending.finish(outcome, args.defer_exit_code, hold=hold)


@dataclass
class _Ending:
    """How a launch that met the other nodes ends: the master's rendezvous, the outcome
    recorded for the report, and the exit code."""

    node: Node
    store: Store
    records: RunRecords | None
    attempt: str
    log: RunLog
    stop_server: Callable[[], None] | None

    def finish(
        self,
        outcome: Outcome,
        defer_exit_code: bool,
        wait_for_others: bool = True,
        hold: Watcher | None = None,
    ) -> int:
        if self.stop_server is not None:
            if outcome.code == 0 and wait_for_others:
                _wait_for_other_nodes(self.node, self.store)
            self.stop_server()
        self.log.say(f"done: {outcome.reason} (exit {outcome.code})")
        if self.records is not None:
            try:
                self.records.finish(self.attempt, self.node.name, outcome)
            except OSError as err:
                self.log.close()
                print(f"error: cannot record the outcome: {err}", file=sys.stderr, flush=True)
                return outcome.code or 1
        if hold is not None:
            _hold(hold, self.log)
        self.log.close()
        return 0 if defer_exit_code else outcome.code


def _approve(watcher: Watcher, log: RunLog) -> None:
    """The workers have checkpointed: let the platform go ahead without waiting out the notice,
    for the events that take only this job's VMs."""
    approve, foreign = watcher.approvable()
    for event in foreign:
        others = sorted(set(event.resources) - watcher.job_vms)
        log.say(
            f"not approving {event.event_type} {event.event_id}: it also takes VMs outside "
            f"this job ({', '.join(others)}); the platform goes ahead at {event.not_before}"
        )
    if not approve:
        return
    try:
        watcher.client.approve(approve)
        log.say("approved the scheduled event(s): the checkpoint is written")
    except OSError as err:
        log.say(f"could not approve the scheduled event(s): {err}")


def _hold(watcher: Watcher, log: RunLog) -> None:
    """Wait for the platform to take this VM (``HOLD_SECONDS``); a signal ends the wait."""
    log.say(
        "waiting for the platform to take this VM: Batch then requeues the task without "
        "counting a retry"
    )
    signal.signal(signal.SIGTERM, lambda _signum, _frame: watcher.release())
    if not watcher.hold(HOLD_SECONDS):
        log.say("the scheduled event ended without taking this VM: exiting (Batch retries)")
    else:
        log.say("stopped waiting for the platform to take this VM: exiting (Batch retries)")
