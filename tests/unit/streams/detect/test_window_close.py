"""The columnar close (``window_close.close_windows``: many ranks' windows, their events grouped
by function at once) against the close one window and one function at a time
(``reference_close``, over the event-at-a-time fold): random batches of several ranks with
device spans of every phase, spans named like the per-kind aggregates they are then replaced
by, collective calls and spans named like them, every span kind, durations past a (lowered)
per-function cap, and windows whose accumulators were read (settled) between batches or settled
as they fold (a lowered memory bound), close into the same records in the same order, however
many windows are closed together."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.streams.detect import (
    DetectionPolicy,
    RankSummarizer,
    accumulate,
    chunk_apply,
    window_close,
    window_columns,
)
from perftracker_ml.streams.detect.summarize import add_batches, poll_many

from .reference_fold import ReferenceSummarizer

MS = 1_000_000
WALL0 = 1_700_000_000_000 * MS
MONO0 = 10**12
POL = DetectionPolicy(window_s=1.0, window_grace_s=1.0, max_open_windows=4, max_duration_s=5.0)
NAMES = ["cuda:Net.forward", "cuda:torch.autograd.backward", "cuda:Adam.step", "cuda:copy", "kind:gc",
         "kind:forward", "Net.forward", "", "all_reduce", "comm:all_reduce:dp", "loader"]
GROUPS = [{"group_id": "dp", "ranks": [0, 1]}, {"group_id": "tp", "ranks": [0, 2]}]
KINDS = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 100])


@st.composite
def batch(draw: st.DrawFn) -> tuple[int, dict]:
    rank = draw(st.integers(0, 2))
    at_ms = draw(st.integers(0, 3_500))
    spans = draw(st.lists(st.tuples(KINDS, st.integers(0, len(NAMES) - 1), st.integers(-900, 0),
                                    st.integers(0, 300)), max_size=14))
    comms = draw(st.lists(st.tuples(st.sampled_from([8, 9]), st.integers(0, 1), st.integers(0, 9),
                                    st.integers(-900, 0), st.integers(0, 300)), max_size=8))
    steps = draw(st.lists(st.integers(0, 40), max_size=2))

    def mono(rel_ms: int) -> int:
        return MONO0 + (at_ms + rel_ms) * MS

    return rank, {
        "job": "j", "rank": rank, "world_size": 3, "host": "h", "gpu": 0, "pid": 1, "seq": 0,
        "wall_ns": WALL0 + at_ms * MS, "mono_ns": mono(0), "names": NAMES, "groups": GROUPS,
        "comms": {"op": [c[0] for c in comms], "group": [c[1] for c in comms], "seq": [c[2] for c in comms],
                  "bytes": [512 * (1 + c[2]) for c in comms], "start_ns": [mono(c[3]) for c in comms],
                  "dur_ns": [c[4] * MS for c in comms]},
        "spans": {"kind": [s[0] for s in spans], "name": [s[1] for s in spans], "start_ns": [mono(s[2]) for s in spans],
                  "dur_ns": [s[3] * MS for s in spans]},
        "iterations": {"step": steps, "start_ns": [mono(-100)] * len(steps), "dur_ns": [90 * MS] * len(steps)},
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(batch(), min_size=1, max_size=6), st.booleans()), min_size=1, max_size=5),
       st.sampled_from([2, 5, 200_000]), st.sampled_from([4, 65_536]), st.sampled_from([1, 30, 1 << 20]))
def test_columnar_close_equals_closing_one_window_and_function_at_a_time(
        chunks: list[tuple[list[tuple[int, dict]], bool]], cap: int, settle_at: int, close_at: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(window_close, "CLOSE_EVENTS", close_at)  # windows closed together in runs of this many events
        mp.setattr(chunk_apply, "SETTLE_EVENTS", settle_at)  # a window past it settles as it folds
        mp.setattr(accumulate, "MAX_DURATIONS_PER_FUNCTION", cap)  # the reference fold's cap
        mp.setattr(window_columns, "MAX_DURATIONS_PER_FUNCTION", cap)  # the columnar fold's
        one = [ReferenceSummarizer("j", r, POL) for r in range(3)]
        many = [RankSummarizer("j", r, POL) for r in range(3)]
        seq = [0, 0, 0]
        for i, (chunk, read) in enumerate(chunks):
            fed = []
            for rank, b in chunk:
                seq[rank] += 1
                b = dict(b, seq=seq[rank])
                one[rank].add_events(b, now_wall_ms=0)
                fed.append((many[rank], False, b))
            assert add_batches(fed, now_wall_ms=0).failure is None
            if read:  # a window's accumulators read between chunks (settled early): the rest added after
                for s in many:
                    for w in s.windows.windows.values():
                        assert w.functions is w.accs and not w.pending
            now = (WALL0 // MS) + 1_000 * i
            expected = [r for s in one for r in s.poll(now)]
            got, failed = poll_many(many, now, False)
            assert not failed and got == expected
        expected = [r for s in one for r in s.poll(0, flush=True)]
        got, failed = poll_many(many, 0, True)
        assert not failed and got == expected
