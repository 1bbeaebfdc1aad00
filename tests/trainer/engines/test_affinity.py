"""trainer.engines.cpu_affinity: each local rank's share of the CPUs, and binding a whole process
(in a child process, so this one stays unbound)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.engines.cpu_affinity import cpu_share


def test_two_ranks_on_two_cpus_get_one_each():
    assert [cpu_share(rank, 2, {0, 1}) for rank in (0, 1)] == [[0], [1]]


def test_eight_ranks_on_an_nd_h100_v5_get_twelve_contiguous_cpus_each():
    shares = [cpu_share(rank, 8, set(range(96))) for rank in range(8)]
    assert shares[0] == list(range(12)) and shares[7] == list(range(84, 96))


def test_the_first_ranks_take_the_cpus_that_do_not_divide_evenly():
    assert [cpu_share(rank, 3, set(range(8))) for rank in range(3)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]


def test_only_the_cpus_this_process_may_use_are_shared():
    # A container's cpuset need not start at 0 or be contiguous.
    assert [cpu_share(rank, 2, {2, 3, 5, 7}) for rank in (0, 1)] == [[2, 3], [5, 7]]


def test_fewer_cpus_than_ranks_leaves_the_ranks_unbound():
    assert cpu_share(0, 4, {0, 1}) is None


def test_a_rank_outside_the_node_is_refused():
    with pytest.raises(ValueError, match=r"local rank 2 outside 0\.\.1"):
        cpu_share(2, 2, {0, 1})


@given(
    st.sets(st.integers(0, 255), min_size=1, max_size=64),
    st.integers(1, 16),
)
def test_shares_are_disjoint_cover_every_cpu_and_differ_by_at_most_one(available, ranks):
    shares = [cpu_share(rank, ranks, available) for rank in range(ranks)]
    if len(available) < ranks:
        assert shares == [None] * ranks
        return
    flat = [cpu for share in shares for cpu in share]
    assert sorted(flat) == sorted(available) and len(flat) == len(set(flat))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


BIND_SCRIPT = """
import json, os, subprocess, sys, threading
from trainer.engines.cpu_affinity import bind_process, each_thread

release = threading.Event()
before = threading.Thread(target=release.wait)  # a thread started before the binding
before.start()
cpu = sorted(os.sched_getaffinity(0))[-1]
bind_process([cpu])
threads = each_thread(lambda thread: sorted(os.sched_getaffinity(thread)))
release.set()
before.join()
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True)
print(json.dumps({"cpu": cpu, "threads": threads, "child": json.loads(child.stdout)}))
"""


REPO = Path(__file__).resolve().parents[3]


def test_binding_covers_threads_started_before_and_processes_started_after():
    result = subprocess.run(
        [sys.executable, "-c", BIND_SCRIPT], capture_output=True, text=True, cwd=REPO, check=True
    )
    report = json.loads(result.stdout)
    assert len(report["threads"]) == 2
    assert all(cpus == [report["cpu"]] for cpus in report["threads"].values())
    assert report["child"] == [report["cpu"]]
