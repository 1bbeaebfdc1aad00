"""The launcher's preflight as pure data: which groups it times in which round, its floors, and
the verdict that names a slow node or link by its Batch node id with the keep-out line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dt_commands.jobs.main import build_parser as jobs_parser
from trainer.launch.node_sizes import node_floor, preflight_floor
from trainer.launch.preflight import wanted
from trainer.launch.preflight_plan import (
    Floors,
    Group,
    Measured,
    Name,
    bus_gbps,
    judge,
    ring_pairs,
    rounds,
)

H100 = "Standard_ND96isr_H100_v5"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "jobs.md"


@pytest.mark.parametrize("nodes", range(1, 10))
@pytest.mark.parametrize("slots", [1, 2, 8])
def test_every_node_and_ring_pair_is_timed_in_at_most_four_rounds(nodes, slots):
    planned = rounds(nodes, slots)
    assert len(planned) <= (1 if slots > 1 else 0) + (3 if nodes > 1 else 0)
    within = [g for groups in planned for g in groups if len(g.nodes) == 1]
    pairs = [g for groups in planned for g in groups if len(g.nodes) == 2]
    assert [g.nodes for g in within] == ([(n,) for n in range(nodes)] if slots > 1 else [])
    assert sorted(g.nodes for g in pairs) == sorted(ring_pairs(nodes))
    for groups in planned:  # a round's groups share no node: they run at the same time
        taken = [n for g in groups for n in g.nodes]
        assert len(taken) == len(set(taken))
    for g in pairs:  # a pair is both nodes' every worker: all of their InfiniBand ports
        a, b = g.nodes
        assert g.ranks == (*range(a * slots, (a + 1) * slots), *range(b * slots, (b + 1) * slots))
    if nodes >= 3:  # two pairs each: a node's fault shows in both, a link's in one
        assert all(sum(n in g.nodes for g in pairs) == 2 for n in range(nodes))


def test_bus_bandwidth_counts_as_nccl_tests_does():
    assert bus_gbps(1000, 2, 1.0) == pytest.approx(1000 * 2**20 / 1e9)
    assert bus_gbps(1000, 16, 1.0) == pytest.approx(1000 * 2**20 * 2 * 15 / 16 / 1e9)


def test_a_gpu_size_is_held_to_its_nvlink_and_infiniband_floors_and_a_cpu_size_to_the_others():
    assert Floors.of(H100) == Floors(node_floor(H100), preflight_floor(H100))
    assert node_floor(H100) == 315.0 and preflight_floor(H100) == 245.0
    assert Floors.of("Standard_D2ds_v5") == Floors.of(None) == Floors(0.0, 0.0)


def test_auto_runs_on_gpu_sizes_on_runs_anywhere_and_one_worker_has_nothing_to_measure():
    assert wanted("auto", H100, 2, 8) and wanted("auto", H100, 1, 8)
    assert not wanted("auto", "Standard_D2ds_v5", 3, 1) and not wanted("auto", None, 3, 1)
    assert wanted("on", None, 2, 1) and not wanted("off", H100, 4, 8)
    assert not wanted("on", None, 1, 1)


NAMES = [Name("10.0.0.4", "tvm-1"), Name("10.0.0.5", "tvm-2"), Name("10.0.0.6", "tvm-3")]


def _measured(within: list[float], pairs: dict[tuple[int, int], float]) -> list[Measured]:
    groups = [Measured(Group((n,), (n,)), gbps) for n, gbps in enumerate(within)]
    return groups + [Measured(Group(nodes, nodes), gbps) for nodes, gbps in pairs.items()]


def test_a_node_below_the_sizes_nvlink_floor_is_named_with_its_keep_out_line():
    verdict = judge(
        _measured([460.0, 120.0, 455.0], {(0, 1): 300.0, (1, 2): 301.0, (2, 0): 299.0}),
        NAMES,
        Floors.of(H100),
    )
    assert "node 10.0.0.5 (tvm-2): 1 workers, allreduce 120 GB/s; BELOW the floor 315 GB/s" in (
        "\n".join(verdict.lines)
    )
    assert (
        verdict.failure
        == "preflight: slow node 10.0.0.5 (tvm-2): dt-jobs keep-out --stack NAME tvm-2"
    )
    assert verdict.lines[-1].endswith(
        "keep it out of the job's next tries: dt-jobs keep-out --stack NAME tvm-2"
    )


def test_a_node_both_of_whose_pairs_are_slow_is_named_and_a_single_slow_pair_is_a_link():
    slow_node = judge(
        _measured([460.0] * 3, {(0, 1): 300.0, (1, 2): 40.0, (2, 0): 41.0}), NAMES, Floors.of(H100)
    )
    assert slow_node.failure == (
        "preflight: slow node 10.0.0.6 (tvm-3): dt-jobs keep-out --stack NAME tvm-3"
    )
    slow_link = judge(
        _measured([460.0] * 3, {(0, 1): 300.0, (1, 2): 40.0, (2, 0): 290.0}), NAMES, Floors.of(H100)
    )
    assert (
        slow_link.failure is not None
        and "slow link between 10.0.0.5 (tvm-2) and 10.0.0.6 (tvm-3)" in (slow_link.failure)
    )
    assert "dt-jobs keep-out --stack NAME tvm-2 (or dt-jobs keep-out --stack NAME tvm-3)" in (
        slow_link.failure
    )
    healthy = judge(
        _measured([460.0] * 3, {(0, 1): 300.0, (1, 2): 290.0, (2, 0): 310.0}),
        NAMES,
        Floors.of(H100),
    )
    assert healthy.failure is None and len(healthy.lines) == 6


def test_without_a_size_floor_a_figure_is_held_to_half_the_others_median():
    slow = judge(_measured([], {(0, 1): 0.5, (1, 2): 0.02, (2, 0): 0.03}), NAMES, Floors())
    assert (
        slow.failure == "preflight: slow node 10.0.0.6 (tvm-3): dt-jobs keep-out --stack NAME tvm-3"
    )
    assert "half the other pairs' median: no size floor" in slow.lines[0]
    # Two nodes: one pair, nothing to compare it with; their own workers compare with each other.
    two = judge(_measured([1.0, 0.1], {(0, 1): 0.01}), NAMES[:2], Floors())
    assert "not judged" in two.lines[-2] and two.failure == (
        "preflight: slow node 10.0.0.5 (tvm-2): dt-jobs keep-out --stack NAME tvm-2"
    )


def test_a_node_outside_batch_is_named_by_its_address_without_a_keep_out_command():
    assert Name("127.0.0.2").keep_out() == (
        "no AZ_BATCH_NODE_ID (not a Batch node): nothing to keep out"
    )


def test_the_keep_out_line_is_the_documented_usage_and_dt_jobs_parses_it():
    line = NAMES[1].keep_out()
    assert re.sub(r"tvm-2$", "NODE_ID", line) in DOCS.read_text(encoding="utf-8")
    args = jobs_parser().parse_args(line.split()[1:])
    assert args.command == "keep-out" and args.nodes == ["tvm-2"] and args.stack == "NAME"
