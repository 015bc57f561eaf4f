"""The scaling benchmark's core at a tiny size (8 ranks, 1 window) and its fit arithmetic."""

from __future__ import annotations

import json

import pytest
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.records import group_members
from perftracker_ml.schemas.rules import limits_for
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import EVENT_BATCH
from perftracker_ml.streams.detect import DetectionPolicy

from benchmarks.scale import SLOW_RANK, SyntheticRanks, extrapolate, fit, run_size, sizes_up_to


def test_eight_ranks_one_window_has_the_json_shape_and_names_the_slow_rank() -> None:
    # one window: raise a finding after one window (the default waits for two)
    out = run_size(8, 1, policy=DetectionPolicy(persist_windows=1))
    assert json.loads(json.dumps(out)) == out
    for key in ("ranks", "windows", "functions", "batches", "events", "cpu_s", "cpu_s_per_window",
                "cpu_us_per_rank_window", "cpu_s_per_window_by_stage", "peak_rss_mb", "incidents", "extrapolated"):
        assert key in out, key
    assert out["ranks"] == 8 and out["windows"] == 1 and out["extrapolated"] is False
    assert out["batches"] == 8 * 5  # one batch per rank per second of a 5 s window
    assert set(out["cpu_s_per_window_by_stage"]) == {"summarize", "compare", "diagnose"}
    assert out["cpu_s"] >= 0 and out["peak_rss_mb"] >= 0
    assert {"cause": "slow_function", "ranks": [SLOW_RANK]} in out["incidents"]
    assert all(i["ranks"] == [SLOW_RANK] for i in out["incidents"])  # no victim named


def test_synthetic_batches_are_valid_event_batches_with_realistic_function_counts() -> None:
    sim = SyntheticRanks(64, functions=30)
    rec = sim.batch(5, 0)
    assert validate(EVENT_BATCH, rec, limits_for(3600.0)) is None
    Codec(EVENT_BATCH).encode(rec)  # the collectors' schema takes it
    spans_per_step = len(set(rec["spans"]["name"]))
    assert spans_per_step == 30
    assert {rec["names"][op] for op in rec["comms"]["op"]} == {"all_gather_into_tensor", "reduce_scatter_tensor",
                                                               "all_reduce"}
    assert [len(group_members(g)) for g in rec["groups"]] == [8, 8]  # TP 8 x DP 8


def test_a_batch_of_five_seconds_holds_five_one_second_batches_events_and_is_numbered_by_period() -> None:
    one, five = SyntheticRanks(64, functions=10), SyntheticRanks(64, functions=10)
    ones = [one.batch(3, s) for s in range(5, 10)]
    rec = five.batch(3, 5, seconds=5)
    assert validate(EVENT_BATCH, rec, limits_for(3600.0)) is None
    assert rec["seq"] == 1 and rec["wall_ns"] == ones[-1]["wall_ns"] and rec["mono_ns"] == ones[-1]["mono_ns"]
    for block in ("iterations", "spans", "comms"):
        for col in ("step", "start_ns"):
            assert rec[block][col] == [v for b in ones for v in b[block][col]], (block, col)
    assert rec["comms"]["seq"] == [v for b in ones for v in b["comms"]["seq"]]  # each group's calls in order


def test_the_slow_rank_slows_at_its_onset_and_a_batch_may_not_span_it() -> None:
    from perftracker_ml.deploy.workloads.ranks import SLOW_EXCESS_MS, STEPS_PER_S

    onset, never = SyntheticRanks(64, functions=10, jitter=0.0, slow_from_s=5), \
        SyntheticRanks(64, functions=10, jitter=0.0, slow_from_s=10**6)
    assert onset.batch(SLOW_RANK, 4)["spans"]["dur_ns"] == never.batch(SLOW_RANK, 4)["spans"]["dur_ns"]
    extra = sum(onset.batch(SLOW_RANK, 5)["spans"]["dur_ns"]) - sum(never.batch(SLOW_RANK, 5)["spans"]["dur_ns"])
    assert extra == 2 * STEPS_PER_S * SLOW_EXCESS_MS * 1_000_000  # its layer and the forward holding it, each step
    with pytest.raises(ValueError, match="spans the onset"):
        onset.batch(SLOW_RANK, 3, seconds=5)


def test_fit_slopes_and_extrapolation() -> None:
    measured = [{"ranks": n, "cpu_s_per_window": n * 0.001, "peak_rss_mb": 0.5 * n, "extrapolated": False,
                 "cpu_s_per_window_by_stage": {"summarize": n * 0.0008, "diagnose": 1e-6 * n * n}}
                for n in (8, 64, 512, 4096)]
    f = fit(measured)
    assert f["time_slope"] == 1.0 and f["memory_slope"] == 1.0 and f["fit_sizes"] == [64, 512, 4096]
    e = extrapolate(100_000, measured, f)
    assert e["extrapolated"] is True and e["from_ranks"] == 4096
    assert f["stage_time_slopes"] == {"summarize": 1.0, "diagnose": 2.0}
    assert abs(e["cpu_s_per_window"] - 100.0) < 0.01 and abs(e["peak_rss_mb"] - 50_000) < 0.1
    assert abs(e["cpu_s_per_window_by_stage"]["diagnose"] - 1e-6 * 100_000**2) < 0.01
    assert sizes_up_to(4096) == [8, 64, 512, 4096]
    assert sizes_up_to(100_000) == [8, 64, 512, 4096, 32768, 100_000]


def test_sharded_diagnose_stage_json_splits_shard_and_merge_and_keeps_the_findings() -> None:
    from benchmarks.scale_shards import run_sharded

    out = run_sharded(64, 2, shard_counts=(1, 3))
    assert out["same_findings"] and out["anomalies_opened"] >= 1
    assert [r["shards"] for r in out["sharded"]] == [1, 3]
    rw = out["input"]["RankWindow"]
    assert rw["records_per_window"] == 64 + 64 // 2  # each rank's two windows and its trailing one, over 2
    assert rw["invalid"] == 0 and rw["bytes_mean"] > 100 and rw["decode_cpu_s"] > 0
    assert out["input"]["FunctionComparison"]["invalid"] == 0
    for r in out["sharded"]:
        assert set(r["ranks_per_window"]) == {64}  # whole windows, not released early
        assert r["shard_side_cpu_s"] > 0 and r["merge_side_cpu_s"] > 0
        assert r["merge_side_cpu_s"] >= r["merge_cpu_s"]
