"""A function a rank calls a few times a window is judged over its recent windows (.rare)."""

from __future__ import annotations

from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect import DetectionPolicy, FunctionComparator
from perftracker_ml.streams.detect.rare import RareHorizon

from .synth import T0_WINDOW, pattern

POL = DetectionPolicy()
HORIZON_WINDOWS = POL.rare_horizon_windows
STEPS = 45


def gen2(rank: int, window: int, ms: float) -> dict:
    """One full collection of ``ms`` (its time net of collectives in flight) in ``window``."""
    return pattern(rank, "gc.gen2", ms / STEPS, window=window, steps=STEPS, calls=1, p50_ms=ms,
                   kind=int(SpanKind.GC), count=1, world_size=4)


def run(windows: list[list[dict]]) -> list[dict]:
    """Every window through one comparator, in order; their FunctionComparisons."""
    c = FunctionComparator("job", "gc.gen2", POL)
    out = []
    for i, pats in enumerate(windows):
        for p in pats:
            c.add(p, now_wall_ms=1000 * i)
        out += c.poll(1000 * i + POL.grace_ms + 1)
    return out


def test_a_collection_that_fell_in_the_next_window_is_no_outlier() -> None:
    # each rank's full collection costs ~350 ms; rank 2's fell in the window after its peers'
    # (whose own ran beside a collective in flight that window: ~1 ms net)
    w0, w1 = T0_WINDOW, T0_WINDOW + 1
    windows = [[gen2(r, w0, 350.0 if r != 2 else 1.0) for r in range(4)],
               [gen2(r, w1, 350.0 if r == 2 else 1.0) for r in range(4)]]
    first, second = run(windows)
    assert first["outliers"] == []
    assert second["outliers"] == [] and second["skipped"]["rare_in_phase"] == 1


def test_without_the_horizon_the_same_window_names_the_rank() -> None:
    # the window alone: rank 2 is a peer outlier (what the live fault suite reported)
    (rec,) = run([[gen2(r, T0_WINDOW, 350.0 if r == 2 else 1.0) for r in range(4)]])
    assert [o["rank"] for o in rec["outliers"]] == [2]


def test_a_rank_whose_rare_calls_are_longer_is_still_named() -> None:
    # rank 2's full collections take 5x its peers' in every window: slow over the horizon too
    windows = [[gen2(r, T0_WINDOW + i, 350.0 if r == 2 else 70.0) for r in range(4)] for i in range(4)]
    recs = run(windows)
    assert all([o["rank"] for o in rec["outliers"]] == [2] for rec in recs)
    assert all("rare_in_phase" not in rec["skipped"] for rec in recs)


def test_a_rank_that_starts_a_slow_rare_call_is_named_in_its_first_window() -> None:
    windows = [[gen2(r, T0_WINDOW + i, 70.0) for r in range(4)] for i in range(HORIZON_WINDOWS - 1)]
    windows.append([gen2(r, T0_WINDOW + HORIZON_WINDOWS, 1400.0 if r == 2 else 70.0) for r in range(4)])
    assert [o["rank"] for o in run(windows)[-1]["outliers"]] == [2]


def test_peers_that_never_ran_it_leave_nothing_to_judge_against() -> None:
    h = RareHorizon.for_policy(POL)
    h.note(7, [(0, "k", 1, 500e6, 45)])
    assert h.stands(0, "k", min_peers=4, min_excess=0.1, min_cost_ms=1.0)


def test_a_frequent_call_clears_the_horizon() -> None:
    h = RareHorizon.for_policy(POL)
    h.note(1, [(r, "k", 1, 350e6 if r else 1e6, 45) for r in range(4)])
    assert not h.stands(0, "k", min_peers=4, min_excess=0.1, min_cost_ms=1.0)
    h.note(2, [(r, "k", 40, 10e6, 45) for r in range(4)])
    assert len(h.windows) == 0 and h.stands(0, "k", min_peers=4, min_excess=0.1, min_cost_ms=1.0)


def test_the_horizon_is_bounded_and_a_window_noted_twice_counts_once() -> None:
    h = RareHorizon.for_policy(POL)
    for w in range(3 * HORIZON_WINDOWS):
        h.note(w, [(r, "k", 1, 1e6, 45) for r in range(4)])
        h.note(w, [(r, "k", 1, 1e6, 45) for r in range(4)])
    assert [w.window_id for w in h.windows] == list(range(2 * HORIZON_WINDOWS, 3 * HORIZON_WINDOWS))
