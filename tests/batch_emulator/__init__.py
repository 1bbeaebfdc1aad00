"""The Batch node emulator: the payloads ``infra`` produces (the pool's start task, job
preparation, the multi-instance task and its containers), run as Batch documents running them, on
emulated nodes in network namespaces. What each module stands for, what it does not emulate and
its interface for the tests and ``bench/``: README.md beside this file."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The program started inside a node's namespaces (a task's PID 1, IMDS, Batch's listener, uploads).
AGENT = Path(__file__).with_name("agent.py")
