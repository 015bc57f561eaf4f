"""The chunk-wide fold (``chunk_fold.fold_chunk`` through ``summarize.add_batches``) against folding the
same batches one at a time (``RankSummarizer.add_events``/``add_hardware``), which
test_fold_equivalence.py holds to the event-at-a-time fold: random chunks of several ranks'
batches, interleaved, with every kind of bad value of that test plus CPU samples, stack rows,
HardwareBatches, final batches and duplicates, leave every rank in the same state after each
chunk and close the same records; and on batches as the collectors build them most batches are
folded column-wise, not one at a time (a rank's first batch ever included: it fixes the rank's first window)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer
from perftracker_ml.streams.detect.summarize import add_batches

from .reference_fold import ReferenceSummarizer
from .test_fold_equivalence import MS, POL, WALL0, batches, state

RANKS = 3


def full_state(s: RankSummarizer) -> tuple:
    cpu = {wid: (w.cpu.samples, dict(w.cpu.frames), dict(w.hw), w.net.samples, dict(w.net.backlog), w.net.addr)
           for wid, w in s.windows.windows.items()}
    return (state(s), cpu, s.windows.batch_wall_ms, s.ended, s.final_closed, vars(s.health),
            s.collector_dropped, s.batches_since_close, s.meta)


@st.composite
def items(draw: st.DrawFn) -> tuple[int, bool, dict]:
    """(rank, is_hardware, batch) with the rank and extras filled in."""
    rank = draw(st.integers(0, RANKS - 1))
    if draw(st.integers(0, 9)) == 0:  # a HardwareBatch
        at = draw(st.integers(0, 12_000))
        n = draw(st.integers(1, 3))
        hw = {"job": "j", "rank": rank, "wall_ns": [WALL0 + (at + 100 * k) * MS for k in range(n)],
              "throttle_reasons": [0] * n}
        for f in ("sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "util_gpu_pct", "pcie_gen",
                  "pcie_width", "nvlink_errors", "ecc_uncorrected", "xid"):
            hw[f] = [float(draw(st.integers(0, 100)))] * n
        return rank, True, hw
    b = dict(draw(batches()), rank=rank)
    if draw(st.booleans()):
        b["cpu"] = [{"interval_ns": 10**9, "thread_cpu_ns": draw(st.integers(0, 10**9)), "stack_samples": 3}]
        b["stacks"] = {"frame": [0, 3], "line": [10, 20], "kind": [1, 0], "count": [2, 1], "code": [-1, 2]}
    if draw(st.booleans()):  # network evidence, alone or with the CPU's (EventBatch v7)
        b["net"] = [{"interval_ns": 10**9, "local_addr": "10.0.0.1", "retrans_segs": 0, "out_segs": 10,
                     "rx_bytes": 1, "tx_bytes": 1, "ib_xmit_wait": -1, "ib_errors": -1,
                     "backlog": [{"remote": "10.0.0.2", "bytes": draw(st.integers(0, 10**6))}]}]
    b["final"] = draw(st.integers(0, 14)) == 0
    b["pid"] = draw(st.sampled_from([1, 1, 1, 2]))
    return rank, False, b


def check(chunks: list[list[tuple[int, bool, dict]]], poll: bool, policy: DetectionPolicy,
          ordered: bool) -> tuple[int, int]:
    """Feed ``chunks`` both ways and compare after each; ``ordered``: each group's collective
    seqs made to increase in each rank's order, and its batches' times to move on mostly (as a
    real rank's do). Returns (batches, folded
    one at a time)."""
    one = [ReferenceSummarizer("j", r, policy) for r in range(RANKS)]
    many = [RankSummarizer("j", r, policy) for r in range(RANKS)]
    seq = [0] * RANKS
    calls: dict[tuple[int, int], int] = {}
    batches = sequential = 0
    for i, chunk in enumerate(chunks):
        fed = []
        for rank, hardware, batch in chunk:
            if not hardware:
                seq[rank] += 1
                batch = dict(batch, seq=seq[rank] - (seq[rank] % 5 == 0))  # some duplicates
                if ordered:  # and time moving on: 1.5 s a batch, give or take 0.75 s
                    batch["wall_ns"] = WALL0 + (1500 * seq[rank] + (batch["wall_ns"] - WALL0) // MS // 16) * MS
                    seqs = []
                    for g in batch["comms"]["group"]:
                        calls[rank, g] = calls.get((rank, g), 0) + 1
                        seqs.append(calls[rank, g] // 2)  # a call's entry marker and its end share a seq
                    batch["comms"] = dict(batch["comms"], seq=seqs)
            fed.append((rank, hardware, batch))
            if hardware:
                one[rank].add_hardware(batch, now_wall_ms=0)
            else:
                one[rank].add_events(batch, now_wall_ms=0)
        result = add_batches([(many[r], h, b) for r, h, b in fed], now_wall_ms=0)
        assert result.failure is None
        batches += sum(not h for _, h, _ in fed)
        sequential += result.sequential
        if i % 2:  # every other chunk: the fold's columns of two chunks then wait in a window (window_columns)
            for a, b in zip(one, many, strict=True):
                assert full_state(a) == full_state(b)
        if poll:
            at = chunk[-1][2]["wall_ns"]
            at = (at[-1] if isinstance(at, list) else at) // MS
            for a, b in zip(one, many, strict=True):
                assert a.poll(at) == b.poll(at)
    for a, b in zip(one, many, strict=True):
        assert a.poll(0, flush=True) == b.poll(0, flush=True)
    return batches, sequential


CHUNKS = st.lists(st.lists(items(), min_size=1, max_size=10), min_size=1, max_size=5)
WIDE = DetectionPolicy(window_s=1.0, window_grace_s=1.0, max_open_windows=64, max_duration_s=5.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHUNKS, st.booleans())
def test_chunk_fold_equals_folding_one_batch_at_a_time(chunks: list[list[tuple[int, bool, dict]]],
                                                        poll: bool) -> None:
    """Anything: random collective seqs, three windows open at most (mostly folded one at a time)."""
    check(chunks, poll, POL, ordered=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHUNKS, st.booleans())
def test_chunk_fold_of_ordered_calls_equals_folding_one_batch_at_a_time(
        chunks: list[list[tuple[int, bool, dict]]], poll: bool) -> None:
    """Collective seqs in order and room for the windows: mostly folded column-wise."""
    check(chunks, poll, WIDE, ordered=True)


def test_collector_batches_fold_column_wise_and_equal_the_one_at_a_time_fold() -> None:
    """Batches of the throughput benchmark's workload (real collector layout: 32 ranks, spans, data-
    and tensor-parallel collectives, iterations): every batch is folded column-wise, each rank's first
    batch (which fixes its first window) included, and the records closed are the one-at-a-time fold's."""
    from perftracker_ml.deploy.workloads.batches import Workload

    from benchmarks.throughput import decode_all, encode_job

    decoded = [rec for _, rec in decode_all(encode_job(Workload(ranks=32, seconds=6), 1_700_000_000_000 * MS))]
    pol = DetectionPolicy()
    one: dict[int, RankSummarizer] = {}
    many: dict[int, RankSummarizer] = {}
    sequential = 0
    for start in range(0, len(decoded), 40):
        chunk = decoded[start:start + 40]
        for b in chunk:
            one.setdefault(b["rank"], ReferenceSummarizer(b["job"], b["rank"], pol)).add_events(b, 0)
        res = add_batches([(many.setdefault(b["rank"], RankSummarizer(b["job"], b["rank"], pol)), False, b)
                           for b in chunk], 0)
        assert res.failure is None
        sequential += res.sequential
    assert sequential == 0, sequential  # each rank's first batch too: its first data fixes its first window
    assert len(decoded) > 5 * 32
    for r in one:
        assert full_state(one[r]) == full_state(many[r])
        assert one[r].poll(0, flush=True) == many[r].poll(0, flush=True)
    assert sum(len(s.skipped) for s in one.values()) == 0 or np.all(
        [dict(one[r].skipped) == dict(many[r].skipped) for r in one])


def _batch(seq: int, at_ms: int, comms: list[tuple[int, int, int, int]], spans: list[tuple[int, int, int]]) -> dict:
    """A batch at ``at_ms`` after WALL0: comms (op, seq, start ms, dur ms) in group 0, spans (name, start ms,
    dur ms) of kind 1, times relative to the batch's."""
    mono0 = 10**12

    def mono(rel: int) -> int:
        return mono0 + (at_ms + rel) * MS

    return {"job": "j", "rank": 0, "world_size": 2, "host": "h", "gpu": -1, "pid": 1, "seq": seq,
            "wall_ns": WALL0 + at_ms * MS, "mono_ns": mono(0), "names": ["load", "", "all_reduce", "fwd"],
            "groups": [{"group_id": "dp", "ranks": [0, 1]}],
            "comms": {"op": [c[0] for c in comms], "group": [0] * len(comms), "seq": [c[1] for c in comms],
                      "bytes": [8] * len(comms), "start_ns": [mono(c[2]) for c in comms],
                      "dur_ns": [c[3] * MS for c in comms]},
            "spans": {"kind": [1] * len(spans), "name": [s[0] for s in spans], "start_ns": [mono(s[1]) for s in spans],
                      "dur_ns": [s[2] * MS for s in spans]},
            "iterations": {"step": [], "start_ns": [], "dur_ns": []}}


def test_latest_event_among_equal_times_is_the_last_folded_and_calls_in_order_end_pending() -> None:
    """Two events at the rank's latest millisecond: the one folded last (the span: spans fold after
    collectives) is where the rank was; the last call is pending, not in flight."""
    pol = DetectionPolicy(window_s=1.0)
    one, many = ReferenceSummarizer("j", 0, pol), RankSummarizer("j", 0, pol)
    first = _batch(0, 0, [], [(0, -500, 10)])
    chunk = [_batch(1, 1000, [(2, 0, -300, 100), (2, 1, -100, 50)], [(3, -50, 5), (0, -400, 1)])]
    for s in (one, many):
        s.add_events(first, 0)
    for b in chunk:
        one.add_events(b, 0)
    assert add_batches([(many, False, b) for b in chunk], 0).sequential == 0
    assert full_state(one) == full_state(many)
    assert (many.progress.last_function, many.progress.last_event_ms) == ("fwd", (WALL0 // MS) + 950)
    assert (many.progress.pending_group, many.progress.pending_seq, many.progress.pending_in_flight) == ("dp", 1, False)


def test_a_malformed_batch_in_a_chunk_is_counted_and_the_others_are_folded() -> None:
    """Garbage in one batch's columns (not numbers) sends the chunk one batch at a time, a batch
    without its spans sends its rank; each bad batch is counted as the one-batch fold counts it,
    nothing raises, and every other batch is folded."""
    pol = DetectionPolicy(window_s=1.0)
    one = [ReferenceSummarizer("j", r, pol) for r in range(3)]
    many = [RankSummarizer("j", r, pol) for r in range(3)]
    for r in range(3):
        for s in (one[r], many[r]):
            s.add_events(dict(_batch(0, 0, [], [(0, -500, 10)]), rank=r), 0)
    garbage = dict(_batch(1, 1000, [(2, 0, -300, 100)], []), rank=0)
    garbage["comms"] = dict(garbage["comms"], dur_ns=["x"])
    no_spans = {k: v for k, v in dict(_batch(1, 1000, [], [(3, -50, 5)]), rank=1).items() if k != "spans"}
    good = dict(_batch(1, 1000, [(2, 0, -300, 100)], [(3, -50, 5)]), rank=2)
    for chunk in ([garbage, no_spans, good], [dict(no_spans, seq=2), dict(good, seq=2)]):
        for b in chunk:
            one[b["rank"]].add_events(b, 0)
        result = add_batches([(many[b["rank"]], False, b) for b in chunk], 0)
        assert result.failure is None
        for a, b in zip(one, many, strict=True):
            assert full_state(a) == full_state(b)
    assert many[0].skipped["bad_batch:ValueError"] == 1 and many[1].skipped["bad_batch:KeyError"] == 2
    assert many[2].skipped == one[2].skipped and "fwd" in many[2].windows.windows[(WALL0 // MS + 950) // 1000].functions


def test_more_batches_than_fold_at_once_are_folded_in_parts_in_order(monkeypatch) -> None:
    """The batch index is packed above the times: a longer list is folded in parts, in order."""
    import perftracker_ml.streams.detect.chunk_fold as chunk_fold

    monkeypatch.setattr(chunk_fold, "MAX_BATCHES", 3)
    pol = DetectionPolicy(window_s=1.0)
    one = [ReferenceSummarizer("j", r, pol) for r in range(2)]
    many = [RankSummarizer("j", r, pol) for r in range(2)]
    batches = [dict(_batch(i, 1000 * i, [(2, i, -300, 100)], [(3, -50, 5)]), rank=r) for i in range(5) for r in range(2)]
    for b in batches:
        one[b["rank"]].add_events(b, 0)
    result = add_batches([(many[b["rank"]], False, b) for b in batches], 0)
    assert result.folded == 10 and result.sequential == 0  # each rank's first batch too (a round of its own)
    assert all(full_state(a) == full_state(b) for a, b in zip(one, many, strict=True))


def test_v8_packed_batches_fold_as_their_v7_encoding_does() -> None:
    """The same batches (collector layout, plus CPU samples and stack rows) encoded as EventBatch v7
    (list columns) and v8 (packed columns, decoded to numpy arrays), folded one at a time and a
    chunk at a time: every rank ends in the same state and closes the same FunctionPattern and
    RankWindow records, whichever the encoding and the fold."""
    from perftracker_ml.deploy.workloads.batches import Workload
    from perftracker_ml.deploy.workloads.batches import batches as workload_batches
    from perftracker_ml.schemas import Codec, bundled_schemas
    from perftracker_ml.schemas.vocabulary import EVENT_BATCH

    v7, v8 = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 7)), Codec(EVENT_BATCH)
    records = [rec for _, rec in workload_batches(Workload(ranks=8, seconds=5, tp=4, pp=2), 1_700_000_000_000 * MS)]
    for i, rec in enumerate(records[::3]):  # the training thread's CPU evidence on some
        names = list(rec["names"]) + ["train.py step", "x.clone()"]
        cpu = {"interval_ns": 10**9, "thread_cpu_ns": 9 * 10**8, "runqueue_wait_ns": 10**7, "voluntary_switches": 3,
               "involuntary_switches": 40, "major_faults": 0, "load1": 3.5, "steal_pct": 0.0, "cpus": 16,
               "stack_samples": 3, "stack_hz": 25.0}
        rec.update(names=names, cpu=[cpu],
                   stacks={"frame": [len(names) - 2] * 2, "line": [88, 90 + i], "kind": [1, 0], "count": [2, 1],
                           "code": [len(names) - 1, -1]})
    as7 = [v7.decode(v7.encode(r)) for r in records]
    as8 = [v8.decode(v8.encode(r)) for r in records]
    assert isinstance(as8[0]["spans"]["start_ns"], np.ndarray) and isinstance(as7[0]["spans"]["start_ns"], list)
    pol = DetectionPolicy()

    def folded(decoded: list[dict], chunked: bool) -> dict[int, RankSummarizer]:
        summ: dict[int, RankSummarizer] = {}
        for start in range(0, len(decoded), 24):
            chunk = decoded[start:start + 24]
            kind = RankSummarizer if chunked else ReferenceSummarizer
            fed = [(summ.setdefault(b["rank"], kind(b["job"], b["rank"], pol)), False, b) for b in chunk]
            if chunked:
                result = add_batches(fed, 0)
                assert result.failure is None
                assert not start or result.sequential == 0  # column-wise: arrays taken as they are
            else:
                for s, _, b in fed:
                    s.add_events(b, 0)
        return summ

    runs = [folded(as7, False), folded(as8, False), folded(as7, True), folded(as8, True)]
    first = runs[0]
    assert any(w.cpu.frames for s in first.values() for w in s.windows.windows.values())
    for other in runs[1:]:
        assert set(other) == set(first)
        for r in first:
            assert full_state(other[r]) == full_state(first[r])
    closed = [[s.poll(0, flush=True) for _, s in sorted(run.items())] for run in runs]
    assert closed[0] and all(c == closed[0] for c in closed[1:])


def test_a_ranks_first_batch_fixes_its_first_window_column_wise_as_one_at_a_time() -> None:
    """Each rank's first batch ever, folded column-wise: the first window is the one of its first
    data in the one-batch fold's order (collectives, spans, iterations; a heartbeat's own time),
    what lies below it is late, and a batch with no plausible data fixes none."""
    pol = DetectionPolicy(window_s=1.0, max_open_windows=8)
    firsts = [
        _batch(0, 3000, [(2, 0, -400, 100)], [(3, -2900, 5), (0, -100, 10)]),  # a collective first; a span 2 windows early
        _batch(0, 3000, [], [(3, -1500, 5), (0, -2500, 10)]),  # spans only: the first one's window, the next late
        _batch(0, 3000, [], []),  # a heartbeat: the batch's own window
        _batch(0, 3000, [(2, 0, -400, -1)], [(0, -2500, 10)]),  # a call in flight is data too: the span is late
        _batch(0, 3000, [(2, 0, -400, 10**7)], [(3, 10**7, 5)]),  # nothing plausible: no window fixed
    ]
    firsts[4]["cpu"] = [{"interval_ns": 10**9, "thread_cpu_ns": 5, "stack_samples": 1}]
    one = [ReferenceSummarizer("j", r, pol) for r in range(len(firsts))]
    many = [RankSummarizer("j", r, pol) for r in range(len(firsts))]
    later = [dict(_batch(1, 4000, [(2, 1, -300, 100)], [(3, -3950, 5), (3, -50, 5)]), rank=r) for r in range(len(firsts))]
    first_window: list[list[int | None]] = []
    late: list[list[int]] = []
    for chunk in ([dict(b, rank=r) for r, b in enumerate(firsts)], later):
        for b in chunk:
            one[b["rank"]].add_events(b, 0)
        assert add_batches([(many[b["rank"]], False, b) for b in chunk], 0).sequential == 0
        for a, b in zip(one, many, strict=True):
            assert full_state(a) == full_state(b)
        first_window.append([s.windows.next_window for s in many])
        late.append([s.skipped["late_event"] for s in many])
    at = WALL0 // MS // 1000
    assert first_window[0] == [at + 2, at + 1, at + 3, at + 2, None]
    assert first_window[1][4] == at + 3  # fixed by its next batch's collective
    assert late[0] == [1, 1, 0, 1, 0]  # the events below the first window (the last rank's are implausible)
    assert all(a.poll(0, flush=True) == b.poll(0, flush=True) for a, b in zip(one, many, strict=True))


def test_a_batch_with_values_no_collector_sends_is_rejected_whole_and_the_others_folded() -> None:
    """Values beyond what the fold's packed keys hold -- a batch clock before 1970, a collective seq or
    a step that is not a number, a span kind that is not a whole number -- reject their batch whole:
    counted as a bad batch, nothing of it folded (the rank's state is the one before it), the
    batches around it folded as if it had not come, in a chunk and alone."""
    pol = DetectionPolicy(window_s=1.0)
    bad = []
    for field, value in (("wall_ns", None), ("seq", float("nan")), ("step", float("nan")), ("kind", 1.5)):
        b = _batch(1, 1000, [(2, 0, -300, 100)], [(3, -50, 5)])
        if field == "wall_ns":  # its events are plausible for its own clock, but before 1970
            b["wall_ns"] = 5 * MS
        elif field == "seq":
            b["comms"] = dict(b["comms"], seq=[value])
        elif field == "step":
            b["iterations"] = {"step": [value], "start_ns": [b["mono_ns"] - 10 * MS], "dur_ns": [5 * MS]}
        else:
            b["spans"] = dict(b["spans"], kind=[value])
        bad.append(b)
    for chunked in (True, False):
        with_bad = [RankSummarizer("j", 0, pol) for _ in bad]
        without = [RankSummarizer("j", 0, pol) for _ in bad]
        for k, b in enumerate(bad):
            first = _batch(0, 0, [], [(0, -500, 10)])
            after = _batch(2, 2000, [(2, 1, -300, 100)], [(3, -50, 5)])
            for s, fed in ((with_bad[k], [first, b, after]), (without[k], [first, after])):
                if chunked and s is with_bad[k]:
                    s.add_events(first, 0)
                    result = add_batches([(s, False, x) for x in fed[1:]], 0)
                    assert result.failure is None and result.sequential == 0
                else:
                    for x in fed:
                        s.add_events(x, 0)
            assert with_bad[k].skipped.pop("bad_batch:ValueError") == 1, bad[k]
            assert state(with_bad[k]) == state(without[k])
