import math

from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer

MS = 1_000_000
WALL0 = 1_700_000_000_000 * MS  # a window boundary (5 s windows)
POL = DetectionPolicy(window_s=5.0, window_grace_s=3.0)


def batch(rank=0, *, seq=1, skew_ms=0, mono0=10**12, spans=(), comms=(), iters=(), wall_at_s=6.0, host="h0"):
    """spans: (kind, name, start_s, dur_ms); comms: (seq, start_s, dur_ms); iters: (step, start_s, dur_ms)."""
    names = ["DataLoader.__next__", "Model.forward", "Model.backward", "all_reduce", "gc.collect"]
    mono = lambda s: int(mono0 + s * 1e9)  # noqa: E731
    return {
        "schema_version": 2, "job": "job", "rank": rank, "local_rank": 0, "world_size": 4, "host": host,
        "gpu": -1, "gpu_uuid": "", "pid": 7, "seq": seq, "dropped_events": 0,
        "wall_ns": WALL0 + int(wall_at_s * 1e9) + skew_ms * MS, "mono_ns": mono(wall_at_s), "names": names,
        "groups": [{"group_id": "world", "ranks": [0, 1, 2, 3]}],
        "iterations": {"step": [i[0] for i in iters], "start_ns": [mono(i[1]) for i in iters],
                       "dur_ns": [int(i[2] * MS) for i in iters]},
        "spans": {"kind": [s[0] for s in spans], "name": [s[1] for s in spans], "path": [-1] * len(spans),
                  "step": [-1] * len(spans), "start_ns": [mono(s[2]) for s in spans],
                  "dur_ns": [s[3] * MS if isinstance(s[3], (int, float)) and math.isfinite(s[3]) else s[3]
                             for s in spans]},
        "comms": {"op": [3] * len(comms), "group": [0] * len(comms), "seq": [c[0] for c in comms],
                  "bytes": [1 << 20] * len(comms), "step": [-1] * len(comms),
                  "start_ns": [mono(c[1]) for c in comms], "dur_ns": [int(c[2] * MS) for c in comms]},
        "kernels": [],
    }


def by_name(records):
    return {(n, r.get("function", "")): r for n, r in records}


def test_window_closes_with_patterns_rank_window_and_kind_aggregates():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(1, 0, 1.0, 10), (3, 1, 1.1, 20)], iters=[(5, 1.0, 40)]))
    s.add_events(batch(seq=2, spans=[(1, 0, 6.0, 10)], wall_at_s=7.0))  # data past the end closes it
    out = by_name(s.poll(now_wall_ms=0))
    assert out[("FunctionPattern", "DataLoader.__next__")]["total_ns"] == 10 * MS
    assert out[("FunctionPattern", "kind:gc")]["count"] == 0  # always reported, even when zero
    rw = out[("RankWindow", "")]
    assert rw["steps"] == 1 and rw["step_time_ns"] == [40 * MS] and rw["last_step"] == 5
    assert rw["window_id"] == WALL0 // MS // 5000


def test_nested_collective_time_is_removed_from_the_enclosing_span():
    """A victim's backward that only waited inside the all-reduce must not look slow."""
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(4, 2, 1.0, 50)], comms=[(0, 1.02, 30)]))
    pats = by_name(s.poll(now_wall_ms=0, flush=True))
    assert pats[("FunctionPattern", "Model.backward")]["total_ns"] == 20 * MS
    assert pats[("FunctionPattern", "comm:all_reduce:world")]["seq_dur_ns"] == [30 * MS]


def test_skewed_host_clock_only_shifts_window_edges():
    a, b = RankSummarizer("job", 0, POL), RankSummarizer("job", 1, POL)
    a.add_events(batch(0, spans=[(3, 1, 2.0, 10)], mono0=5 * 10**11))
    b.add_events(batch(1, spans=[(3, 1, 2.0, 10)], skew_ms=-40, mono0=9 * 10**12))
    wa = {r["window_id"] for _, r in a.poll(0, flush=True)}
    wb = {r["window_id"] for _, r in b.poll(0, flush=True)}
    assert wa == wb  # 40 ms of skew, same window; monotonic origins never compared


def test_bad_input_is_counted_never_raised():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(3, 1, 1.0, float("nan")), (3, 1, 1.0, -5), (3, 99, 1.0, 5), (3, 1, 1.0, 5)]))
    s.add_events(batch(seq=1))  # duplicate delivery
    s.add_events({"job": "job", "rank": 0})  # truncated
    s.add_events(batch(rank=3, seq=9))  # someone else's batch
    bad = batch(seq=5)
    bad["spans"]["kind"] = [1, 2]  # ragged columns
    s.add_events(bad)
    assert s.skipped["bad_duration"] == 2 and s.skipped["bad_name_index"] == 1
    assert s.skipped["duplicate_batch"] == 1 and s.skipped["wrong_rank_or_job"] == 1
    assert s.skipped["ragged_columns"] == 1 and any(k.startswith("bad_batch") for k in s.skipped)
    out = by_name(s.poll(0, flush=True))
    assert out[("FunctionPattern", "Model.forward")]["count"] == 1
    assert out[("RankWindow", "")]["lost_batches"] == 3  # seq 1 -> 5


def test_silent_rank_still_produces_rank_windows_after_grace():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(3, 1, 1.0, 10)], iters=[(1, 1.0, 20)], comms=[(7, 1.05, 3)]))
    now = WALL0 // MS + 3 * 5000 + 3500  # three windows later, past grace
    windows = [r for n, r in s.poll(now) if n == "RankWindow"]
    assert [w["steps"] for w in windows] == [1, 0, 0]
    assert windows[-1]["pending_group"] == "world" and windows[-1]["pending_seq"] == 7
    assert windows[-1]["last_function"] == "comm:all_reduce:world"


def test_hardware_is_aggregated_per_window():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(3, 1, 1.0, 10)]))
    n = 3
    hw = {"schema_version": 1, "job": "job", "rank": 0, "host": "h0", "gpu": 0, "gpu_uuid": "", "seq": 0,
          "wall_ns": [WALL0 + i * 10**9 for i in range(n)], "sm_clock_mhz": [1400, 1500, -1],
          "sm_clock_max_mhz": [1980] * n, "mem_clock_mhz": [0] * n, "util_gpu_pct": [90] * n,
          "util_mem_pct": [0] * n, "temp_c": [80, 91, 85], "power_w": [500.0] * n, "power_limit_w": [700.0] * n,
          "throttle_reasons": [0x4, 0x40, 0], "pcie_gen": [5] * n, "pcie_width": [16, 8, 16],
          "pcie_tx_kbps": [0] * n, "pcie_rx_kbps": [0] * n, "nvlink_tx_kbps": [0] * n,
          "nvlink_rx_kbps": [0] * n, "nvlink_errors": [0] * n, "ecc_uncorrected": [0] * n, "xid": [0] * n}
    s.add_hardware(hw)
    rw = by_name(s.poll(0, flush=True))[("RankWindow", "")]
    assert rw["sm_clock_mhz"] == 1450 and rw["temp_c_max"] == 91 and rw["throttle_reasons"] == 0x44
    assert rw["pcie_width_min"] == 8 and rw["hw_samples"] == 3


def test_absurd_timestamps_do_not_open_far_windows():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(3, 1, 1.0, 10), (3, 1, 90_000.0, 10)], iters=[(1, -90_000.0, 5)]))
    assert s.skipped["bad_timestamp"] >= 2
    out = [r for n, r in s.poll(0, flush=True) if n == "RankWindow"]
    assert len(out) == 1


def test_entry_markers_mark_the_rank_inside_its_call_and_keep_its_windows_closing():
    """A rank waiting in an all-reduce keeps sending batches with only its entry marker (dur -1):
    its windows close by those batches' time (never 'quiet'), pending_in_flight until it completes."""
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(spans=[(3, 1, 1.0, 10)], iters=[(1, 1.0, 20)], comms=[(7, 1.05, 3)]))
    for k in range(2, 14):  # one marker batch a second from 2 s to 13 s: seq 8, entered at 1.5 s
        s.add_events(batch(seq=k, comms=[(8, 1.5, -1e-6)], wall_at_s=k), now_wall_ms=WALL0 // MS + k * 1000)
    windows = [r for n, r in s.poll(WALL0 // MS + 13_000) if n == "RankWindow"]  # not quiet: closed by data
    assert [w["window_id"] - windows[0]["window_id"] for w in windows] == [0, 1]
    assert windows[-1]["pending_seq"] == 8 and windows[-1]["pending_in_flight"] is True
    s.add_events(batch(seq=14, comms=[(8, 1.5, 12_000)], wall_at_s=14))  # completed after 12 s
    s.add_events(batch(seq=15, wall_at_s=21))
    windows = [r for n, r in s.poll(WALL0 // MS + 21_000) if n == "RankWindow"]
    assert windows[-1]["pending_seq"] == 8 and windows[-1]["pending_in_flight"] is False
