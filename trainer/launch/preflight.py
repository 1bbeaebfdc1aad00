"""The launcher's preflight (``--preflight``), on every node after the nodes met and before its
workers start, for every job kind (the trainer, a job's own command): it starts one probe per
worker slot (``trainer.launch.preflight_probe``), which time the plan's allreduces within each
node and between pairs of nodes (``trainer.launch.preflight_plan``), reads the figures, logs
them and the verdict, and fails the try naming a slow node or link with its keep-out line.
Bounded: at most ``PREFLIGHT_SECONDS``. Why: docs/internals.md, `trainer/launch/preflight.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from trainer.launch.batch_env import Node
from trainer.launch.node_sizes import fabric_for
from trainer.launch.preflight_plan import Floors, Measured, Name, bus_gbps, judge, rounds
from trainer.launch.preflight_probe import RESULT, ROUND
from trainer.launch.records import Outcome, RunLog
from trainer.launch.stop import STOP

MODES = ("auto", "on", "off")
# The whole preflight: the probes' start (torch, CUDA, NCCL), their meeting and every round.
PREFLIGHT_SECONDS = 180
# Each group: one warm-up, then ITERATIONS timed allreduces of this many MB (on GPUs the size
# nccl-tests reaches full bandwidth at; on CPUs enough to dwarf a loopback's latency).
GPU_MEGABYTES = 256
CPU_MEGABYTES = 4
ITERATIONS = 5


def wanted(mode: str, vm_size: str | None, nodes: int, slots: int) -> bool:
    """Whether to run it: ``auto`` on a GPU size (whose floors it holds each node and pair to),
    ``on`` also elsewhere (CPU nodes: floors relative to the other nodes); never with a single
    worker, which has nothing to measure."""
    if mode == "off" or nodes * slots < 2:
        return False
    return mode == "on" or (vm_size is not None and fabric_for(vm_size).gpus > 0)


@dataclass(frozen=True)
class Preflight:
    """This node's part of the preflight: its place, its workers' count and the probes' port
    on the master (torch's store port: free until the workers start)."""

    node: Node
    slots: int
    port: int
    vm_size: str | None

    def spec(self, local: int, plan: list, gpu: bool) -> str:
        position = self.node.master_first_rank
        return json.dumps(
            {
                "master": self.node.master_ip,
                "port": self.port,
                "nodes": len(self.node.hosts),
                "world": len(self.node.hosts) * self.slots,
                "slots": self.slots,
                "position": position,
                "rank": position * self.slots + local,
                "local": local,
                "host": self.node.name,
                "node_id": self.node.node_id,
                "device": "cuda" if gpu else "cpu",
                "megabytes": GPU_MEGABYTES if gpu else CPU_MEGABYTES,
                "iterations": ITERATIONS,
                "timeout": PREFLIGHT_SECONDS,
                "rounds": [[list(group.ranks) for group in groups] for groups in plan],
            }
        )


def run_preflight(preflight: Preflight, env: dict[str, str], log: RunLog) -> Outcome | None:
    """Measure, log and judge; None when the workers may start, else the try's outcome."""
    node, slots = preflight.node, preflight.slots
    plan = rounds(len(node.hosts), slots)
    gpu = preflight.vm_size is not None and fabric_for(preflight.vm_size).gpus > 0
    log.say(
        f"preflight: {len(node.hosts)} node(s) x {slots} worker(s), {len(plan)} round(s): each "
        "node's own workers together, then pairs of nodes"
    )
    started = time.monotonic()
    probe_env = {**env, "GLOO_SOCKET_IFNAME": node.iface, "PYTHONUNBUFFERED": "1"}
    probes = _Probes([preflight.spec(local, plan, gpu) for local in range(slots)], probe_env)
    ended = probes.wait(started + PREFLIGHT_SECONDS)
    if ended is not None:
        return _ended(ended, probes, plan, node, log)
    result = probes.result()
    if result is None:
        return _failed(f"preflight: node {node.label}: its first probe printed no result", log)
    groups = [group for groups in plan for group in groups]
    megabytes = GPU_MEGABYTES if gpu else CPU_MEGABYTES
    measured = [
        Measured(group, bus_gbps(megabytes, len(group.ranks), result["seconds"][str(index)]))
        for index, group in enumerate(groups)
    ]
    names = [Name(host, node_id) for host, node_id in result["names"]]
    verdict = judge(measured, names, Floors.of(preflight.vm_size))
    for line in verdict.lines:
        log.say(line)
    took = f"{time.monotonic() - started:.1f} s"
    if verdict.failure is not None:
        return _failed(f"{verdict.failure} (took {took})", log)
    log.say(f"preflight: passed in {took}")
    return None


def _failed(reason: str, log: RunLog) -> Outcome:
    log.say(reason)
    return Outcome(1, reason)


def _ended(why: str, probes: _Probes, plan: list, node: Node, log: RunLog) -> Outcome:
    """The outcome of a preflight its probes did not finish: a signal, a failed probe, or the
    time limit (naming the round this node's first probe was in, and its peers there)."""
    probes.stop()
    if why == "signal":
        log.say(f"signal {STOP.signum} during the preflight: not starting the workers")
        return Outcome(0, f"signal {STOP.signum} during the preflight", True)
    if why == "timeout":
        where = ""
        if probes.round is not None and probes.round < len(plan):
            position = node.master_first_rank
            hosts = [node.master_ip, *[h for h in node.hosts if h != node.master_ip]]
            groups = [g for g in plan[probes.round] if position in g.nodes]
            peers = [hosts[n] for g in groups for n in g.nodes if n != position] or ["none"]
            others = ", ".join(peers)
            where = f" (in round {probes.round + 1} of {len(plan)}; other nodes: {others})"
        why = f"not done within {PREFLIGHT_SECONDS} s{where}"
    return _failed(f"preflight: node {node.label}: {why}", log)


class _Probes:
    """This node's probe processes, each in its own session; their output is kept, the last
    round each reached noted."""

    def __init__(self, specs: list[str], env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "trainer.launch.preflight_probe"]
        self.processes = [
            subprocess.Popen(
                [*command, spec],
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for spec in specs
        ]
        self.output: list[list[str]] = [[] for _ in specs]
        self.round: int | None = None
        self._readers = [
            threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(len(specs))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, index: int) -> None:
        stream = self.processes[index].stdout
        assert stream is not None  # a pipe: stdout=PIPE
        for line in stream:
            self.output[index].append(line.rstrip("\n"))
            if index == 0 and line.startswith(ROUND):
                self.round = int(line[len(ROUND) :])
        stream.close()

    def wait(self, deadline: float) -> str | None:
        """None once every probe exited 0; else "signal", "timeout" or the failure's line."""
        while any(p.poll() is None for p in self.processes):
            if STOP.requested:
                return "signal"
            if time.monotonic() > deadline:
                return "timeout"
            for local, process in enumerate(self.processes):
                if process.poll() not in (None, 0):
                    return self._failure(local, process.returncode)
            time.sleep(0.1)
        for local, process in enumerate(self.processes):
            if process.returncode != 0:
                return self._failure(local, process.returncode)
        for reader in self._readers:
            reader.join(5)
        return None

    def _failure(self, local: int, code: int) -> str:
        self._readers[local].join(2)
        said = [line for line in self.output[local] if not line.startswith("@")]
        last = said[-1] if said else "no output"
        return f"probe {local} exited with {code}: {last}"

    def result(self) -> dict | None:
        for line in self.output[0]:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
        return None

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        for reader in self._readers:
            reader.join(5)
