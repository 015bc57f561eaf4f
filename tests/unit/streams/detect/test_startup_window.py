"""A rank's first window (partial, skewed by start-up) does not count toward ``persist_steps``:
what only it shows opens nothing; what the next window shows too opens there; a fault that
starts later still opens after one window of enough steps."""

from __future__ import annotations

from perftracker_ml.streams.detect import DetectionPolicy, FunctionComparator, JobDiagnoser

from .synth import T0_WINDOW, W_MS, pattern, rank_window

POL = DetectionPolicy(window_s=5.0, window_grace_s=3.0, persist_windows=2, persist_steps=50)
WORLD, STEPS, FN = 4, 100, "Model.forward"  # 100 steps a window: persist_steps is met by one window


def window(d: JobDiagnoser, w: int, slow: bool | None) -> list[dict]:
    """Feed window ``w`` (rank 2 twice as slow in Model.forward when ``slow``; None: heartbeats
    only, no step, as while a script imports); the anomalies it gives."""
    if slow is None:
        for r in range(WORLD):
            d.add("RankWindow", rank_window(r, window=w, steps=0, world=WORLD), (w + 1) * W_MS + 600)
        return [a for a in d.poll((w + 1) * W_MS + 600)[0] if a["status"] == "OPEN" and a["ranks"]]
    rws = [rank_window(r, window=w, steps=STEPS, world=WORLD, functions=[FN]) for r in range(WORLD)]
    now = (w + 1) * W_MS + 600
    names = sorted({FN, "kind:dataloader", "kind:optimizer", "kind:forward", "kind:backward", "kind:gc"})
    for f in names:
        pats = [pattern(r, f, 20.0 if slow and r == 2 and f == FN else 10.0, window=w, steps=STEPS,
                        world_size=WORLD) for r in range(WORLD)]
        d.add("FunctionComparison", FunctionComparator("job", f, POL).evaluate(w, pats), now)
    for rw in rws:
        d.add("RankWindow", rw, now)
    return [a for a in d.poll(now)[0] if a["status"] == "OPEN" and a["ranks"]]  # the slow rank's


def run(slow: list[bool | None]) -> list[list[tuple]]:
    d = JobDiagnoser("job", POL)
    return [[(a["ranks"], a["windows"]) for a in window(d, T0_WINDOW + i, s)] for i, s in enumerate(slow)]


def test_what_only_the_start_up_window_shows_opens_nothing():
    assert run([True, False, False]) == [[], [], []]


def test_the_start_up_window_is_the_first_with_steps_not_the_first_heartbeat():
    assert run([None, True, False, False]) == [[], [], [], []]
    assert run([None, False, True]) == [[], [], [([2], 1)]]


def test_what_the_next_window_shows_too_opens_there():
    assert run([True, True]) == [[], [([2], 2)]]


def test_a_fault_after_start_up_opens_after_one_window_of_enough_steps():
    assert run([False, True]) == [[], [([2], 1)]]
