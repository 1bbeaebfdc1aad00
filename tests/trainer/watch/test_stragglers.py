"""Naming a slow rank from the ranks' step times (trainer.watch.stragglers), with a fake clock."""

from __future__ import annotations

import math

from trainer.watch.stragglers import StepClock, StragglerSummary, find_stragglers

HOSTS = ["node-a", "node-a", "node-b", "node-b"]
NAN = math.nan


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_splits_each_step_into_data_wait_and_own_work():
    clock = FakeClock()
    timer = StepClock(clock=clock)
    waits = iter([0.05, 0.5, 0.05, 0.05])

    def loader():
        for _ in range(4):
            clock.now += next(waits)  # the loader takes this long to hand over the batch
            yield object()

    timer.step_done(None)  # the step before the window: its wall time holds the set-up
    for _ in timer.batches(loader()):
        clock.now += 0.2  # the step's forward and backward
        clock.now += 0.1  # waiting for the other ranks' gradients
        timer.step_done(0.1)
    step, wait, compute = timer.take()
    # Medians: the one slow batch (0.5 s) moves neither.
    assert (round(step, 6), round(wait, 6), round(compute, 6)) == (0.35, 0.05, 0.2)
    assert all(math.isnan(v) for v in timer.take())  # a new window


def test_without_the_engines_reduction_wait_own_work_is_not_measured():
    clock = FakeClock()
    timer = StepClock(clock=clock)
    for _ in range(3):
        clock.now += 1.0
        timer.step_done(None)
    step, wait, compute = timer.take()
    assert step == 1.0 and wait == 0.0 and math.isnan(compute)


def test_a_rank_waiting_for_its_data_is_named_with_its_host_and_by_how_much():
    # Rank 2 waits 0.4 s per step for data; the others wait for it in the reduction, so every
    # step takes 0.5 s everywhere and only rank 2's own work and wait tell it apart.
    rows = [[0.5, 0.0, 0.1]] * 4
    rows[2] = [0.5, 0.4, 0.1]
    [straggler] = find_stragglers(100, HOSTS, rows, margin=0.5)
    assert (straggler.rank, straggler.host, straggler.metric) == (2, "node-b", "data_wait_sec")
    assert round(straggler.excess_of_step, 6) == 0.8
    assert "rank 2 on node-b" in straggler.line() and "80%" in straggler.line()
    assert straggler.record()["kind"] == "straggler"


def test_a_rank_slow_in_its_own_work_is_named_not_the_ranks_waiting_for_it():
    rows = [[1.0, 0.01, 0.3]] * 4
    rows[1] = [1.0, 0.01, 0.95]
    assert [(s.rank, s.metric) for s in find_stragglers(5, HOSTS, rows, 0.5)] == [
        (1, "compute_sec")
    ]


def test_noise_below_the_margin_and_unmeasured_times_name_nobody():
    rows = [[0.5, 0.02, NAN], [0.6, 0.2, NAN], [0.55, 0.05, NAN], [0.5, 0.01, NAN]]
    assert find_stragglers(5, HOSTS, rows, 0.5) == []
    # Exactly at the margin is not beyond it.
    assert find_stragglers(5, HOSTS[:2], [[1.0, 0.0, NAN], [1.0, 0.5, NAN]], 0.5) == []


def test_two_ranks_compare_each_with_the_other():
    rows = [[0.3, 0.0, NAN], [0.3, 0.25, NAN]]
    assert [s.rank for s in find_stragglers(5, HOSTS[:2], rows, 0.5)] == [1]


def test_the_summary_counts_windows_and_keeps_the_worst_excess():
    summary = StragglerSummary()
    slow = [[0.5, 0.0, NAN], [0.5, 0.3, NAN]]
    slower = [[0.5, 0.0, NAN], [0.5, 0.45, NAN]]
    for rows in (slow, slower, [[0.5, 0.0, NAN]] * 2):
        summary.add(find_stragglers(1, HOSTS[:2], rows, 0.5))
    [entry] = summary.result()
    assert entry == {
        "rank": 1,
        "host": "node-a",
        "metric": "data_wait_sec",
        "windows": 2,
        "worst_excess_of_step": 0.9,
        "of_windows": 3,
    }
