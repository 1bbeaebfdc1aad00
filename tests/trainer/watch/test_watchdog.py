"""The step watchdog (trainer/watch/watchdog.py) on a fake clock: when it fires, what it writes and
says, and what restarts its clock. Two real workers stuck in a collective:
test_watchdog_two_workers.py."""

from __future__ import annotations

import json
import os
import threading

import pytest

from trainer.common.exit_codes import WATCHDOG_EXIT
from trainer.watch import watchdog
from trainer.watch.watchdog import FLOOR_SECONDS, NEAR_DUE, StepWatchdog, limit_seconds

# The bytes torch 2.13's flight recorder dumped (_dump_fr_trace_json) after one allreduce on a
# one-rank Gloo group with TORCH_FR_BUFFER_SIZE=100.
FR_DUMP = (
    '{"comm_lib_version":"","entries":[{"collective_seq_id":1,"input_dtypes":["Float"],'
    '"input_sizes":[[3]],"is_p2p":false,"op_id":1,"output_dtypes":["Float"],"output_sizes":'
    '[[3]],"p2p_seq_id":0,"pg_id":0,"process_group":["0","default_pg"],"profiling_name":'
    '"gloo:all_reduce","record_id":0,"retired":true,"state":"scheduled","thread_id":"1",'
    '"thread_name":"python","time_created_ns":1,"time_discovered_completed_ns":0,'
    '"time_discovered_started_ns":0,"timeout_ms":1800000}],"nccl_comm_state":{},"pg_config":'
    '{"":{"desc":"","name":"","ranks":"[0]"}},"pg_status":{"0":{"last_completed_collective":'
    '"1","last_enqueued_collective":"1","last_started_collective":"-1"}},"version":"2.10"}'
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path, minutes=0.0, backend="horovod"):
    clock, exits = FakeClock(), []
    dog = StepWatchdog(
        minutes,
        rank=3,
        host="node-7.internal",
        backend=backend,
        folder=tmp_path / "watchdog",
        clock=clock,
        exit=exits.append,
    )
    return dog, clock, exits


def test_the_limit_is_the_setting_or_twenty_median_steps_never_under_the_floor():
    assert limit_seconds(0.5, [100.0]) == 30.0
    assert limit_seconds(0, []) == FLOOR_SECONDS
    assert limit_seconds(0, [1.0, 2.0, 50.0]) == FLOOR_SECONDS  # 20 x 2 s is under the floor
    assert limit_seconds(0, [40.0, 60.0, 1.0]) == 20 * 40.0


def test_steps_keep_it_quiet_and_silence_past_the_limit_fires_once(tmp_path, capsys):
    dog, clock, exits = make(tmp_path, minutes=1.0)
    for step in range(1, 5):
        clock.now += 50
        dog.beat(step)
        assert not dog.check()
    clock.now += 59.9
    assert not dog.check() and exits == []
    clock.now += 0.2
    assert dog.check()
    assert exits == [WATCHDOG_EXIT]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: watchdog: rank 3 on host node-7.internal is stuck: ")
    assert "no step completed for 60 s (limit 60 s, --step-timeout-minutes) after step 4" in err[0]
    assert "Horovod's stall inspector" in err[0]


def test_a_peers_failure_fires_a_rank_that_was_nearly_due_and_only_keeps_the_others_record(
    tmp_path, capsys
):
    """A peer that fired first broke this rank's collective: a rank idle for most of its limit
    is as stuck and names itself; one that was training only keeps its record."""
    training, clock, exits = make(tmp_path / "training", minutes=1.0, backend="ddp")
    clock.now += 0.5 * 60
    training.peer_failed()
    assert exits == [] and not capsys.readouterr().err
    assert not list((tmp_path / "training" / "watchdog").glob("*.stacks.txt"))
    due, clock, exits = make(tmp_path / "due", minutes=1.0, backend="ddp")
    due.beat(2)
    clock.now += NEAR_DUE * 60
    due.peer_failed()
    assert exits == [WATCHDOG_EXIT]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: watchdog: rank 3 on host node-7.internal is stuck: no step")
    assert "(limit 60 s, --step-timeout-minutes) after step 2" in line
    assert list((tmp_path / "due" / "watchdog").glob("rank-3-*.stacks.txt"))


def test_evaluations_and_saves_restart_the_clock_but_are_no_step(tmp_path):
    dog, clock, exits = make(tmp_path)
    for step in range(1, 4):
        clock.now += 40
        dog.beat(step)
    clock.now += 500  # an evaluation
    dog.beat()
    clock.now += 599  # a save, just under the floor; the evaluation did not raise the median
    dog.beat()
    assert dog.limit() == 20 * 40.0 == 800.0
    clock.now += 799
    assert not dog.check()
    clock.now += 1
    assert dog.check() and exits == [WATCHDOG_EXIT]


def blocked_in_a_collective(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait()


def test_the_stacks_file_names_the_frame_every_thread_is_blocked_in(tmp_path, capsys):
    dog, clock, _ = make(tmp_path, minutes=0.05)
    entered, release = threading.Event(), threading.Event()
    stuck = threading.Thread(
        target=blocked_in_a_collective, args=(entered, release), name="trainer-main"
    )
    stuck.start()
    try:
        entered.wait()
        clock.now += 3
        assert dog.check()
    finally:
        release.set()
        stuck.join()
    stacks = (tmp_path / "watchdog" / "rank-3-node-7.internal.stacks.txt").read_text()
    assert stacks.startswith("rank 3 on node-7.internal: no step completed for 3.0 s")
    readable, raw = stacks.split("faulthandler (every thread")
    block = readable.split("thread trainer-main")[1].split("\nthread ")[0]
    assert "in blocked_in_a_collective" in block and "release.wait()" in block
    assert "in blocked_in_a_collective" in raw  # faulthandler's own dump, after it
    stacks_path = tmp_path / "watchdog" / "rank-3-node-7.internal.stacks.txt"
    assert str(stacks_path) in capsys.readouterr().err


def test_torch_engines_dump_the_flight_recorder_and_the_line_sums_it_up(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(watchdog, "engine_view", lambda backend: ("flight recorder", FR_DUMP))
    dog, clock, _ = make(tmp_path, minutes=0.05, backend="ddp")
    clock.now += 3
    assert dog.check()
    dumped = tmp_path / "watchdog" / "rank-3-node-7.internal.collectives.json"
    assert json.loads(dumped.read_text())["entries"][0]["profiling_name"] == "gloo:all_reduce"
    line = capsys.readouterr().err
    assert f"flight recorder: group 0: #1 enqueued, #1 completed, in {dumped}" in line


def test_the_real_engine_view_without_a_process_group_is_still_json():
    kind, text = watchdog.engine_view("ddp")
    assert kind == "flight recorder"
    assert isinstance(json.loads(text), dict)
    assert watchdog.engine_view("horovod") is None


def test_the_flight_recorder_is_enabled_for_torch_engines_unless_the_operator_chose(monkeypatch):
    env: dict[str, str] = {}
    watchdog.enable_flight_recorder("ddp", env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000"}
    env = {"TORCH_FR_BUFFER_SIZE": "50"}
    watchdog.enable_flight_recorder("fsdp", env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "50"}
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}
    watchdog.enable_flight_recorder("ddp", env)
    assert "TORCH_FR_BUFFER_SIZE" not in env
    env = {}
    watchdog.enable_flight_recorder("horovod", env)
    assert env == {}


@pytest.mark.parametrize("minutes", [0.0, 0.05])
def test_a_closed_watchdog_never_fires(tmp_path, minutes):
    dog, clock, exits = make(tmp_path, minutes=minutes)
    dog.start()
    dog.close()
    clock.now += 10**6
    assert not dog.check() and exits == []
    assert not os.path.exists(tmp_path / "watchdog")


def test_kept_without_firing_the_engine_view_is_where_a_firing_writes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "engine_view", lambda backend: ("flight recorder", FR_DUMP))
    dog, _, exits = make(tmp_path, backend="ddp")
    said = dog.keep_engine_view()
    dumped = tmp_path / "watchdog" / "rank-3-node-7.internal.collectives.json"
    assert said == f"flight recorder: group 0: #1 enqueued, #1 completed, in {dumped}"
    assert dumped.read_text() == FR_DUMP and exits == []  # nothing fired, nothing exits
    monkeypatch.undo()  # Horovod's engine keeps no record a worker can read
    assert make(tmp_path / "hvd", backend="horovod")[0].keep_engine_view() is None


@pytest.mark.parametrize(
    ("error", "kept"),
    [
        # Gloo's words when the other end of a collective went away (trainer.engines.base).
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), True),
        (ValueError("a bug of this rank's own"), False),
    ],
)
def test_a_rank_that_stops_because_another_worker_did_keeps_its_engine_view(
    tmp_path, monkeypatch, error, kept
):
    """Two workers stuck in a collective: whichever watchdog fires first ends the other's
    collective, which then stops with a peer failure before its own watchdog fires; its record
    is still written, the half that says who waited for whom (test_watchdog_two_workers.py)."""
    from tests.conftest import tiny_config
    from trainer.engines.local import LocalDist
    from trainer.settings.train_config import DEFAULTS
    from trainer.training import run

    monkeypatch.setattr(watchdog, "engine_view", lambda backend: ("flight recorder", FR_DUMP))

    def collective_fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(run, "train_one_epoch", collective_fails)
    cfg = DEFAULTS.replace(**tiny_config(tmp_path / "run", backend="local"))
    with pytest.raises(type(error)):
        run.train(cfg, LocalDist())
    dumps = list((tmp_path / "run" / "watchdog").glob("rank-0-*.collectives.json"))
    assert [d.read_text() for d in dumps] == ([FR_DUMP] if kept else [])


def test_a_rank_fired_by_a_peers_failure_writes_the_stacks_kept_while_it_was_blocked(
    tmp_path, capsys
):
    """The two-worker test once found the stuck rank's dump without its blocked frame: a peer's
    watchdog fired first, its exit broke the collective, and the stuck rank's main thread moved
    on before it dumped. The watchdog thread keeps the stacks past half the limit."""
    dog, clock, exits = make(tmp_path, minutes=1.0)
    dog.beat(2)
    entered, release = threading.Event(), threading.Event()
    stuck = threading.Thread(
        target=blocked_in_a_collective, args=(entered, release), name="trainer-main"
    )
    stuck.start()
    try:
        entered.wait()
        clock.now += 20
        dog.keep_stacks()  # under half the limit: nothing kept yet
        clock.now += 20
        dog.keep_stacks()  # 40 s of 60: kept, while the thread waits in the collective
    finally:
        release.set()  # the peer's failure breaks it
        stuck.join()
    clock.now += NEAR_DUE * 60 - 40
    dog.peer_failed()
    assert exits == [WATCHDOG_EXIT]
    stacks = (tmp_path / "watchdog" / "rank-3-node-7.internal.stacks.txt").read_text()
    first = stacks.splitlines()[0]
    assert first.endswith(
        "; the stacks as the watchdog saw them 40.0 s in, before a peer's failure broke the "
        "collective this rank waited in"
    )
    block = stacks.split("faulthandler (every thread")[0].split("thread trainer-main")[1]
    assert "in blocked_in_a_collective" in block.split("\nthread ")[0]
    capsys.readouterr()


def test_a_beat_forgets_the_kept_stacks(tmp_path):
    dog, clock, exits = make(tmp_path, minutes=1.0)
    clock.now += 40
    dog.keep_stacks()
    dog.beat(3)  # the rank moved on: the stacks kept are not where it is stuck now
    clock.now += NEAR_DUE * 60
    dog.peer_failed()
    stacks = (tmp_path / "watchdog" / "rank-3-node-7.internal.stacks.txt").read_text()
    assert "as the watchdog saw them" not in stacks.splitlines()[0] and exits == [WATCHDOG_EXIT]
