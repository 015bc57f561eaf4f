"""The summarizer's fold (the chunk fold, a batch a chunk of one) against the event-at-a-time fold
(``reference_fold.ReferenceFolder``, the oracle): random batch sequences of one rank, with bad name
and group indexes, in-flight markers, bad and huge durations, implausible and late times, more
windows than may be open, and polls closing windows in between, leave both in the same state
after every other batch (windows and their accumulators -- the columns of the batches between
grouped by function at once --, progress, skip counts, drops) and close the same records."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer

from .reference_fold import ReferenceSummarizer

MS = 1_000_000
WALL0 = 1_700_000_000_000 * MS
MONO0 = 10**12
POL = DetectionPolicy(window_s=1.0, window_grace_s=1.0, max_open_windows=3, max_duration_s=5.0)
NAMES = ["load", "", "all_reduce", "fwd", "all_gather", "comm:all_reduce:dp"]  # the last: a span named like a call
GROUPS = [{"group_id": "dp", "ranks": [0, 1]}, {"group_id": "tp", "ranks": [0, 2, 4]}]

times_ms = st.integers(min_value=-9_000, max_value=3_000)  # relative to the batch's time
durs_ms = st.one_of(st.integers(min_value=0, max_value=400), st.sampled_from([-1, -50, 7_000]))


@st.composite
def comms(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    return (draw(st.integers(-1, len(NAMES))), draw(st.integers(-1, len(GROUPS))), draw(st.integers(0, 12)),
            draw(times_ms), draw(durs_ms))


@st.composite
def spans(draw: st.DrawFn) -> tuple[int, int, int, int]:
    return draw(st.integers(0, 8)), draw(st.integers(-1, len(NAMES))), draw(times_ms), draw(durs_ms)


@st.composite
def batches(draw: st.DrawFn) -> dict:
    at_ms = draw(st.integers(0, 12_000))  # the batch's time after WALL0 (may go back: late data)
    cs, ss = draw(st.lists(comms(), max_size=12)), draw(st.lists(spans(), max_size=12))
    its = draw(st.lists(st.tuples(st.integers(0, 50), times_ms, durs_ms), max_size=3))

    def mono(rel_ms: int) -> int:
        return MONO0 + (at_ms + rel_ms) * MS

    def dur(d: int) -> int:
        return d * MS if d >= 0 else (-1 if d == -1 else d * MS)

    return {
        "job": "j", "rank": 0, "world_size": 4, "host": "h", "gpu": -1, "pid": 1, "seq": 0,
        "wall_ns": WALL0 + at_ms * MS, "mono_ns": mono(0), "names": NAMES, "groups": GROUPS,
        "comms": {"op": [c[0] for c in cs], "group": [c[1] for c in cs], "seq": [c[2] for c in cs],
                  "bytes": [1024] * len(cs), "start_ns": [mono(c[3]) for c in cs], "dur_ns": [dur(c[4]) for c in cs]},
        "spans": {"kind": [s[0] for s in ss], "name": [s[1] for s in ss], "start_ns": [mono(s[2]) for s in ss],
                  "dur_ns": [dur(s[3]) for s in ss]},
        "iterations": {"step": [i[0] for i in its], "start_ns": [mono(i[1]) for i in its],
                       "dur_ns": [dur(i[2]) for i in its]},
    }


def state(s: RankSummarizer) -> tuple:
    win = s.windows
    accs = {wid: ({n: (a.kind, a.durations, a.seqs, a.seq_durs, a.group_ranks, a.bytes, a.overflow)
                   for n, a in w.functions.items()}, w.steps, w.step_ns, w.last_event_ms)
            for wid, w in win.windows.items()}
    return (accs, vars(s.progress), dict(s.skipped), win.data_ms, win.next_window, win.dropped)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(batches(), st.booleans()), min_size=1, max_size=8))
def test_one_pass_fold_equals_the_event_at_a_time_fold(seq: list[tuple[dict, bool]]) -> None:
    new, old = RankSummarizer("j", 0, POL), ReferenceSummarizer("j", 0, POL)
    for i, (batch, poll) in enumerate(seq):
        b = dict(batch, seq=i)
        new.add_events(b, now_wall_ms=0)
        old.add_events(b, now_wall_ms=0)
        if i % 2:  # every other batch: the fold's columns of two batches then wait in a window (window_columns)
            assert state(new) == state(old)
        if poll:
            assert new.poll(batch["wall_ns"] // MS) == old.poll(batch["wall_ns"] // MS)
    assert new.poll(0, flush=True) == old.poll(0, flush=True)
