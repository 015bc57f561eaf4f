"""The overhead benchmark's arithmetic (the runs themselves are benchmarks, not tests)."""

import pytest

from benchmarks.collector_overhead import _ci95, _env_pairs, _summarize


def _run(step_ms: float, thread_ms: float, **extra: float) -> dict:
    return {"step_ms": step_ms, "step_p50_ms": step_ms, "step_p99_ms": 2 * step_ms,
            "thread_ms_per_step": thread_ms, "cpu_ms_per_step": thread_ms * 2,
            "max_rss_mb": 100.0, "steps": 100, "train_s": 2.0, "cpu_s": 0.4, **extra}


def test_interval_of_pair_ratios_brackets_their_geometric_mean():
    geo, (lo, hi) = _ci95([1.0, 1.1, 0.95, 1.05])
    assert lo < geo < hi and abs(geo - (1.0 * 1.1 * 0.95 * 1.05) ** 0.25) < 1e-9
    geo, (lo, hi) = _ci95([1.02, 1.02, 1.02])
    assert lo == hi == 1.02
    assert _ci95([1.3]) == (1.3, [])


def test_summary_ratios_and_background_share():
    plain = [_run(10.0, 2.0), _run(12.0, 2.0)]
    instrumented = [_run(11.0, 2.2, events=800, bytes=18000, dropped=0, background_cpu_s=0.004,
                         background_cpu_by_thread={"perftracker-sender": 0.004}),
                    _run(12.0, 2.2, events=800, bytes=18000, dropped=3, background_cpu_s=-1.0)]
    out = _summarize(plain, instrumented, 100)
    assert out["step_time_ratio"] == round(11.5 / 11.0, 4)
    assert out["per_pair_ratio"] == [1.1, 1.0]
    assert out["thread_cpu_ratio"] == 1.1 and out["events_per_step"] == 8.0
    assert out["wire_bytes_per_rank_per_s"] == -1  # no librdkafka statistics in these runs
    instrumented[0]["wire_ratio"] = instrumented[1]["wire_ratio"] = 0.5
    assert _summarize(plain, instrumented, 100)["wire_bytes_per_rank_per_s"] == round(18000 / 2.0 * 0.5)
    assert out["bytes_per_rank_per_s"] == 9000 and out["events_dropped"] == 3
    assert out["background_cpu_share"] == 0.01  # the run without /proc is left out
    assert out["background_share_by_thread"] == {"perftracker-sender": 0.005}  # median of 0.01, 0
    assert out["step_p50_ratio"] == round(11.5 / 11.0, 4) and out["step_p99_ms_with"] == 23.0
    assert out["fixed_us_per_step"] == 200.0  # 0.2 ms more training-thread CPU per step, both pairs
    assert out["thread_cpu_ratio_ci95"] == [1.1, 1.1]
    lo, hi = out["step_time_ratio_ci95"]
    assert out["step_time_ratio_half_width_pct"] == pytest.approx(100 * (hi - lo) / 2 / out["step_time_ratio_geomean"],
                                                                  rel=1e-2)


def test_env_pairs_need_a_key_and_an_equals_sign():
    assert _env_pairs(["A=", "B=x=y"]) == {"A": "", "B": "x=y"}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        _env_pairs(["novalue"])


def test_ablation_reports_same_round_differences_in_total_and_by_phase():
    from benchmarks.collector_ablation import summarize

    # the machine drifts by +100 us in round 2; the pairs stay 5/10 us apart
    off = [{"fetch": 100.0, "backward": 500.0}, {"fetch": 150.0, "backward": 550.0},
           {"fetch": 100.0, "backward": 500.0}]
    full = [{"fetch": 102.0, "backward": 508.0}, {"fetch": 152.0, "backward": 558.0},
            {"fetch": 103.0, "backward": 507.0}]
    out = summarize({"off": off, "full": full})
    assert out["off_us_per_step"] == 600.0 and out["rounds"] == 3
    assert out["off_phases_us"] == {"fetch": 100.0, "backward": 500.0}
    assert out["configs"]["full"] == {"added_us": 10.0, "added_pct": round(100 * 10 / 600, 2),
                                      "phases_added_us": {"fetch": 2.0, "backward": 8.0}}


def test_hotpath_reports_the_median_process_and_every_process():
    from benchmarks.collector_hotpath import summarize

    runs = [{"python_event_ns": p, "collective_event_ns": c, "calls_per_round": 10, "rounds": 3}
            for p, c in ((400.0, 740.0), (430.0, 1590.0), (410.0, 760.0))]
    out = summarize(runs)
    assert out["python_event_ns"] == 410.0 and out["collective_event_ns"] == 760.0
    assert out["collective_event_ns_per_process"] == [740.0, 1590.0, 760.0] and out["processes"] == 3
