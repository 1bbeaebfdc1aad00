"""The benchmark plumbing (not the figures): steady rates skip the warm-up window, and plots
are drawn from results files."""

import json
import re

import pytest

from bench import common, plots


def test_steady_rate_is_the_median_after_the_first_window(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "images_per_sec_total": rate} for rate in (5.0, 100.0, 90.0, 110.0)]
    rows.insert(2, {"kind": "val", "images_per_sec_total": 1.0})
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert common.steady_rate(metrics) == 100.0


def test_plots_are_drawn_from_results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(plots, "RESULTS", tmp_path)
    (tmp_path / "scaling.json").write_text(
        json.dumps(
            {
                "workers": 2,
                "results": {
                    "horovod": {
                        "images_per_sec_1": 60.0,
                        "images_per_sec_2": 110.0,
                        "efficiency": 0.917,
                    }
                },
            }
        )
    )
    (tmp_path / "data_path.json").write_text(
        json.dumps(
            {
                "image_size": 224,
                "images_per_sec": {"folder": 400.0, "cache_decoded": 2400.0},
                "speedup_vs_folder": {"folder": 1.0, "cache_decoded": 6.0},
            }
        )
    )
    plots.main()
    for name in ("scaling.png", "data_path.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_steady_value_skips_the_warm_up_window_and_other_records():
    records = [
        {"kind": "train", "tokens_per_sec_total": 1.0},
        {"kind": "checkpoint", "step": 2, "stall_sec": 9.0},
        {"kind": "train", "tokens_per_sec_total": 30.0},
        {"kind": "train", "tokens_per_sec_total": 50.0},
    ]
    assert common.steady_value(records, "tokens_per_sec_total") == 40.0
    assert common.steady_value(records[:1], "tokens_per_sec_total") == 1.0


def test_read_records_keeps_every_record_in_order(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"kind": "train", "step": 1}\n\n{"kind": "checkpoint", "step": 1}\n')
    assert [r["kind"] for r in common.read_records(metrics)] == ["train", "checkpoint"]


def test_expected_state_is_16_bytes_per_parameter_over_the_shard_group():
    from bench.engine_memory import state_bytes_per_rank

    assert state_bytes_per_rank(124_439_808, 1) == 16 * 124_439_808
    assert state_bytes_per_rank(1000, 2) == 8000
    with pytest.raises(ValueError, match="shard_group=0"):
        state_bytes_per_rank(1000, 0)


def test_engine_memory_takes_the_largest_train_peak():
    from bench.engine_memory import peak_memory_gb

    records = [
        {"kind": "train", "peak_memory_gb": 2.5},
        {"kind": "train", "peak_memory_gb": 3.25},
        {"kind": "checkpoint", "stall_sec": 1.0},
    ]
    assert peak_memory_gb(records) == 3.25


def test_mid_run_stalls_leave_out_the_last_save():
    from bench.checkpoint_stall import mid_run_stalls

    records = [
        {"kind": "train", "step": 10},
        {"kind": "checkpoint", "step": 10, "stall_sec": 0.1},
        {"kind": "checkpoint", "step": 20, "stall_sec": 0.2},
        {"kind": "checkpoint", "step": 31, "stall_sec": 5.0},  # the final, synchronous save
    ]
    assert mid_run_stalls(records) == [0.1, 0.2]
    assert mid_run_stalls(records[:2]) == []


def test_scaling_efficiency_is_total_over_workers_times_one():
    from bench.lm_throughput import efficiency

    assert efficiency(180.0, 100.0, 2) == 0.9


def test_each_engine_has_its_own_and_the_plain_workers_efficiency():
    from bench.scaling import Run, summarize

    def runs(*rates):
        return [Run(rate, 500.0) for rate in rates]

    rows = summarize(
        {
            "independent": (runs(40.0, 44.0, 42.0), runs(80.0, 81.0, 79.0)),
            "ddp": (runs(30.0, 31.0, 32.0), runs(63.0, 65.0, 64.0)),
        },
        workers=2,
    )
    assert rows["independent"]["efficiency"] == 80.0 / 84.0  # the machine's ceiling
    assert rows["ddp"]["efficiency"] == 64.0 / 62.0  # against DDP's own 1-worker run
    assert rows["ddp"]["efficiency_vs_plain_worker"] == 64.0 / 84.0
    assert rows["ddp"]["images_per_sec_1"] == 31.0


def test_a_ranks_step_is_taken_apart_into_the_engines_cpu_and_idle_time():
    from bench.scaling import BATCH, Run, summarize

    # The plain worker: 40 images/s of 32-image steps is 800 ms a step, 700 of them on the CPU.
    # DDP's 2 ranks: 64 images/s together, each rank's step 1,000 ms, 760 of them on the CPU.
    rows = summarize(
        {
            "independent": (
                [Run(40.0, 690.0), Run(40.0, 700.0), Run(40.0, 710.0)],
                [Run(78.0, 720.0)],
            ),
            "ddp": ([Run(39.0, 705.0)], [Run(60.0, 700.0), Run(64.0, 760.0), Run(70.0, 790.0)]),
        },
        workers=2,
    )
    step = rows["ddp"]["step_ms_2"]
    assert step["wall"] == 1000.0 * BATCH * 2 / 64.0 == 1000.0
    assert step["cpu"] == 760.0
    assert step["cpu_beyond_plain_worker"] == 60.0  # against the plain worker's 700 alone
    assert step["idle"] == 240.0
    assert rows["ddp"]["cpu_ms_per_step_1"] == 705.0
    # The efficiency against the plain worker is its step's wall time over the row's.
    assert rows["ddp"]["efficiency_vs_plain_worker"] == 1000.0 * BATCH / 40.0 / step["wall"]


def test_a_runs_cpu_per_step_is_its_steady_cpu_seconds_over_the_window(monkeypatch):
    import bench.scaling
    from bench.scaling import LOG_EVERY, Run

    # Each window's record: the ranks' mean CPU seconds over LOG_EVERY steps; the first window
    # (warm-up) is left out, as for the rate.
    records = [
        {"kind": "train", "images_per_sec_total": 10.0, "cpu_sec": 9.0},
        {"kind": "eval", "images_per_sec_total": 99.0, "cpu_sec": 99.0},
        {"kind": "train", "images_per_sec_total": 40.0, "cpu_sec": 2.8},
        {"kind": "train", "images_per_sec_total": 42.0, "cpu_sec": 3.0},
        {"kind": "train", "images_per_sec_total": 41.0, "cpu_sec": 2.9},
    ]
    monkeypatch.setattr(bench.scaling, "run_records", lambda launcher, flags, env: records)
    assert bench.scaling.run(["python"], [], {}) == Run(41.0, 1000 * 2.9 / LOG_EVERY)


def test_the_memory_window_opens_at_the_first_step_and_closes_at_the_final_save(tmp_path):
    from bench.engine_memory import training_window

    metrics = tmp_path / "metrics.jsonl"
    assert not training_window(metrics)  # not written yet
    metrics.write_text('{"kind": "train", "step": 1}\n{"kind": "tra')  # a line being written
    assert training_window(metrics)
    metrics.write_text('{"kind": "train", "step": 1}\n{"kind": "checkpoint", "step": 3}\n')
    assert not training_window(metrics)


def _write_goal_results(folder, horovod, ddp, scaled, default, node, rank, ceiling=0.9):
    # Throughput: each engine's 2-worker images/s, here in proportion to its efficiency.
    scaling_rows = {
        name: {"efficiency": value, "images_per_sec_2": 100 * value}
        for name, value in (("horovod", horovod), ("ddp", ddp), ("independent", ceiling))
    }
    results = {
        "scaling": {"workers": 2, "results": scaling_rows},
        "data_path": {"speedup_vs_folder": {"shards_256": scaled, "shards": default}},
        "cache_memory": {"copies": {"node": node, "rank": rank}},
    }
    for name, body in results.items():
        (folder / f"{name}.json").write_text(json.dumps(body))


def test_goals_compare_each_saved_result_with_its_target(tmp_path):
    from bench import goals

    _write_goal_results(tmp_path, 0.84, 0.86, 2.78, 1.77, 1.0, 1.004)
    found = {goal.name: goal for goal in goals.goals(results=tmp_path)}
    parity = found["Horovod 2-worker efficiency / DDP's"]
    assert parity.measured == pytest.approx(0.84 / 0.86) and parity.met
    assert found["Horovod 2-worker efficiency"].met is False  # 0.84 < 0.85
    ceiling = found["Horovod 2-worker efficiency / the run's ceiling"]
    assert ceiling.measured == pytest.approx(0.84 / 0.9) and ceiling.met is False  # < 0.95
    throughput = found["Horovod 2-worker images/s / DDP's"]
    assert throughput.measured == pytest.approx(84 / 86) and throughput.met is False
    _write_goal_results(tmp_path, 0.88, 0.86, 2.78, 1.77, 1.0, 1.004, ceiling=0.92)
    found_met = {goal.name: goal for goal in goals.goals(results=tmp_path)}
    assert found_met["Horovod 2-worker efficiency / the run's ceiling"].met  # 0.957
    assert found_met["Horovod 2-worker images/s / DDP's"].met
    _write_goal_results(tmp_path, 0.84, 0.86, 2.78, 1.77, 1.0, 1.004)
    assert found["data path per core, 256 px shards / folder before"].met
    assert found["data path per core, default shards / folder before"].met is False
    # One copy per node, give or take tmpfs's whole pages; two copies is no longer one.
    assert found["decoded cache per node, scope rank (copies)"].met
    _write_goal_results(tmp_path, 0.84, 0.86, 2.78, 1.77, 1.0, 2.0)
    rank = {goal.name: goal for goal in goals.goals(results=tmp_path)}[
        "decoded cache per node, scope rank (copies)"
    ]
    assert rank.met is False
    report = goals.report(goals.goals(results=tmp_path)).splitlines()
    assert len(report) == 1 + len(found)
    assert report[2].startswith("Horovod 2-worker efficiency ")
    assert report[2].split()[-4:] == ["0.840", ">=", "0.85", "NO"]


def test_goals_never_report_a_result_from_before_the_run(tmp_path):
    import os

    from bench import goals

    _write_goal_results(tmp_path, 0.9, 0.9, 3.0, 3.0, 1.0, 1.0)
    old = tmp_path / "scaling.json"
    os.utime(old, (1_000, 1_000))
    found = goals.goals(since=2_000, results=tmp_path)
    assert [goal.met for goal in found[:4]] == [None] * 4
    assert all(goal.met for goal in found[4:])
    assert "not measured in this run" in goals.report(found)
    (tmp_path / "data_path.json").unlink()
    assert goals.goals(results=tmp_path)[4].measured is None


def test_the_pool_series_declares_the_cluster_component_that_many_times_and_then_once_again():
    """bench.program_eval's ``pools(n)``: n Batch accounts and pools, each account with a name
    of its own (Batch account names are global), and the program as it was once it ends."""
    from bench.program_eval import pools
    from dt_commands.plan import REPO, evaluate, read_stack_file

    values = read_stack_file(REPO / "Pulumi.dev.yaml")

    def declared(plan, kind):
        return [r for r in plan.resources if r.typ == f"azure-native:batch:{kind}"]

    with pools(3):
        grown = evaluate("dev", values)
    plain = evaluate("dev", values)
    assert len(declared(grown, "Pool")) == 3 and len(declared(plain, "Pool")) == 1
    names = [r.inputs["accountName"] for r in declared(grown, "BatchAccount")]
    assert len(names) == len(set(names)) == 3
    # "Batch account names must be between 3 and 24 characters in length and must use only
    # numbers and lowercase letters" (BatchAccount_Create's accountName, Azure SDK reference).
    assert all(re.fullmatch(r"[a-z0-9]{3,24}", name) for name in names), names
