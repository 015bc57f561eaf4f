"""A window is evaluated as soon as every rank has reported it; the grace is the fallback.

Comparator: when every expected rank's pattern is in (world size, or a collective's group).
Diagnoser: when every rank's RankWindow and a comparison of every function they name are in.
Persistence also counts steps: ``persist_steps`` steps open an incident before
``persist_windows`` windows have passed.
"""

from __future__ import annotations

from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import Kind
from perftracker_ml.streams.detect import DetectionPolicy, Finding, FunctionComparator, JobDiagnoser
from perftracker_ml.streams.detect.incidents import Track, step
from perftracker_ml.streams.detect.rank_records import pattern_functions

from .synth import T0_WINDOW, W_MS, comm_pattern, pattern, rank_window

POL = DetectionPolicy(window_s=5.0, window_grace_s=3.0)
WORLD = 4
NOW = (T0_WINDOW + 1) * W_MS + 600  # just past the window's end


def patterns_of(function: str, world: int = WORLD, slow: int | None = None) -> list[dict]:
    return [pattern(r, function, 20.0 if r == slow else 10.0, world_size=world) for r in range(world)]


# ---- comparator ----------------------------------------------------------------------
def test_comparator_evaluates_the_window_when_its_last_rank_reports_and_not_before():
    c = FunctionComparator("job", "Model.forward", POL)
    pats = patterns_of("Model.forward", slow=2)
    for p in pats[:-1]:
        c.add(p, NOW)
        assert c.poll(NOW) == []  # a rank missing, the grace not over: wait
    c.add(pats[-1], NOW + 10)
    (rec,) = c.poll(NOW + 10)  # the last rank is in: no grace to wait out
    assert rec["window_id"] == T0_WINDOW and rec["ranks_seen"] == WORLD


def test_comparator_expects_the_members_of_a_collective_group_not_the_world():
    c = FunctionComparator("job", "comm:all_reduce:g", POL)
    members = [0, 1]  # a two-rank group in a job of 64
    for r in members[:-1]:
        c.add(comm_pattern(r, "g", [1, 2, 3], [5.0] * 3, members), NOW)
    assert c.poll(NOW) == []
    c.add(comm_pattern(1, "g", [1, 2, 3], [5.0] * 3, members), NOW)
    (rec,) = c.poll(NOW)
    assert rec["ranks_seen"] == 2


def test_comparator_falls_back_to_the_grace_when_a_rank_is_missing():
    c = FunctionComparator("job", "Model.forward", POL)
    for p in patterns_of("Model.forward")[:-1]:  # rank 3 never reports
        c.add(p, NOW)
    assert c.poll(NOW + POL.grace_ms) == []
    (rec,) = c.poll(NOW + POL.grace_ms + 1)
    assert rec["ranks_seen"] == WORLD - 1


def test_comparator_waits_past_its_grace_while_patterns_of_the_window_still_come():
    """A worker near its capacity reads one window's patterns over seconds: a grace after the
    first pattern, with the last come half a grace ago or less, the window waits; once the
    patterns stop for half a grace it is evaluated with the ranks that came."""
    c = FunctionComparator("job", "Model.forward", POL)
    pats = patterns_of("Model.forward", world=WORLD + 1)  # rank 4 never reports
    half = POL.grace_ms // 2
    for i, p in enumerate(pats[:WORLD]):
        c.add(p, NOW + i * half)  # one every half grace
    last = NOW + (WORLD - 1) * half
    assert last > NOW + POL.grace_ms
    assert c.poll(last) == [] and c.poll(last + half) == []
    (rec,) = c.poll(last + half + 1)
    assert rec["ranks_seen"] == WORLD


# ---- diagnoser -----------------------------------------------------------------------
def rank_windows(world: int = WORLD) -> list[dict]:
    return [rank_window(r, world=world, functions=["Model.forward"]) for r in range(world)]


def comparisons(rws: list[dict]) -> list[dict]:
    """What the comparators send for the functions the rank windows name (real comparators)."""
    names = sorted(set().union(*(pattern_functions(rw) for rw in rws)))
    return [FunctionComparator("job", f, POL).evaluate(T0_WINDOW, patterns_of(f, world=len(rws))) for f in names]


def every_rank_in() -> tuple[JobDiagnoser, list[dict]]:
    """A diagnoser holding every rank's RankWindow of the window, no comparison yet; and the
    comparisons the comparators send for the functions they name."""
    d = JobDiagnoser("job", POL)
    rws = rank_windows()
    for rw in rws:
        d.add("RankWindow", rw, NOW)
    return d, comparisons(rws)


def last_rank_missing() -> JobDiagnoser:
    """A diagnoser holding every comparison of the window and every rank's RankWindow but the
    last rank's (it never comes)."""
    d = JobDiagnoser("job", POL)
    rws = rank_windows()
    for rw in rws[:-1]:
        d.add("RankWindow", rw, NOW)
    for cmp in comparisons(rws):
        d.add("FunctionComparison", cmp, NOW)
    return d


def test_rank_windows_name_the_kind_aggregates_their_ranks_sent():
    (rw,) = rank_windows(world=1)
    assert pattern_functions(rw) == {"Model.forward", "kind:dataloader", "kind:optimizer", "kind:forward",
                                     "kind:backward", "kind:gc"}
    assert pattern_functions(rank_window(0, steps=0)) == set()  # a silent rank sent no pattern


def test_diagnoser_evaluates_the_window_when_its_last_rank_reports_and_not_before():
    d = JobDiagnoser("job", POL)
    rws = rank_windows()
    for cmp in comparisons(rws):
        d.add("FunctionComparison", cmp, NOW)
    for rw in rws[:-1]:
        d.add("RankWindow", rw, NOW)
        d.poll(NOW)
        assert d.windows.evaluated_upto is None and not d.windows.empty()
    d.add("RankWindow", rws[-1], NOW)
    d.poll(NOW)  # same instant: no timer involved
    assert d.windows.evaluated_upto == T0_WINDOW and d.windows.empty()


def test_diagnoser_waits_for_every_comparison_its_rank_windows_name():
    d, cmps = every_rank_in()
    for cmp in cmps[:-1]:
        d.add("FunctionComparison", cmp, NOW)
        d.poll(NOW)
        assert d.windows.evaluated_upto is None
    d.add("FunctionComparison", cmps[-1], NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto == T0_WINDOW


def test_a_redelivered_rank_window_naming_another_function_makes_the_window_wait_for_its_comparison():
    """What the window still waits for is worked out once every rank is in, then struck off as
    comparisons come; a RankWindow added after that (a re-delivered copy that names one more
    function) makes it be worked out again."""
    d, cmps = every_rank_in()
    for cmp in cmps[:-1]:
        d.add("FunctionComparison", cmp, NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto is None  # one comparison missing
    extra = [rank_window(r, world=WORLD, functions=["Model.forward", "Model.loss"]) for r in range(WORLD)]
    for rw in extra:  # every rank's copy now names Model.loss too
        d.add("RankWindow", rw, NOW)
    d.add("FunctionComparison", cmps[-1], NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto is None  # Model.loss, which every rank names, is not compared yet
    (loss,) = [c for c in comparisons(extra) if c["function"] == "Model.loss"]
    d.add("FunctionComparison", loss, NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto == T0_WINDOW


def test_a_window_whose_ranks_are_all_in_waits_for_its_comparisons_while_the_stages_between_hold_records():
    """Half a grace after the first comparison the window would go on the caller's clock; while
    patterns or findings still wait between the stages (the compare stage behind), it waits for
    the comparisons its RankWindows announce, and goes once nothing waits."""
    d, cmps = every_rank_in()
    d.add("FunctionComparison", cmps[0], NOW)
    d.windows.clock.relayed_pending = True
    d.poll(NOW + POL.grace_ms)
    assert d.windows.evaluated_upto is None  # the other comparisons may still come
    d.windows.clock.relayed_pending = False
    d.poll(NOW + POL.grace_ms + 1)
    assert d.windows.evaluated_upto == T0_WINDOW  # nothing waits upstream: the grace decides again


def test_a_missing_rank_is_waited_for_half_a_grace_whatever_waits_between_the_stages():
    d = last_rank_missing()
    d.windows.clock.relayed_pending = True
    d.poll(NOW + POL.grace_ms // 2 + 1)
    assert d.windows.evaluated_upto == T0_WINDOW


def test_diagnoser_falls_back_to_the_grace_when_a_rank_is_missing():
    d = last_rank_missing()
    d.poll(NOW + POL.grace_ms // 2)
    assert d.windows.evaluated_upto is None
    d.poll(NOW + POL.grace_ms // 2 + 1)
    assert d.windows.evaluated_upto == T0_WINDOW


def test_diagnoser_releases_windows_in_order_even_when_a_later_one_is_complete():
    d = JobDiagnoser("job", POL)
    d.add("RankWindow", rank_window(0, world=2, steps=0), NOW)  # window 0: rank 1 missing
    for r in range(2):
        d.add("RankWindow", rank_window(r, window=T0_WINDOW + 1, world=2, steps=0), NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto is None  # window 1 is complete but waits for window 0
    d.poll(NOW + 2 * POL.grace_ms + 1001)
    assert d.windows.evaluated_upto == T0_WINDOW + 1


# ---- persistence in steps ------------------------------------------------------------
def finding(extra_windows: int = 0) -> Finding:
    return Finding(kind=Kind.OUTLIER, cause=Cause.SLOW_DATALOADER, identity="slow|2", ranks=(2,), hosts=("h",),
                   gpus=(-1,), function="DataLoader.__next__", score=9.0, impact_ms=10.0, summary="rank 2 slow",
                   extra_windows=extra_windows)


def statuses(policy: DetectionPolicy, steps_per_window: list[int], f: Finding | None = None) -> list[list[str]]:
    """Statuses sent per window for a finding seen in every window."""
    tracks: dict[str, Track] = {}
    out = []
    for i, steps in enumerate(steps_per_window):
        recs = step(tracks, [f or finding()], "job", i * W_MS, (i + 1) * W_MS, 50.0, policy, steps=steps)
        out.append([r["status"] for r in recs])
    return out


def test_persist_steps_opens_in_the_first_window_at_the_threshold():
    pol = DetectionPolicy(persist_windows=2, persist_steps=50)
    assert statuses(pol, [50, 50]) == [["OPEN"], []]


def test_below_persist_steps_the_windows_decide():
    pol = DetectionPolicy(persist_windows=2, persist_steps=50)
    assert statuses(pol, [49, 49]) == [[], ["OPEN"]]


def test_steps_add_up_over_consecutive_windows():
    pol = DetectionPolicy(persist_windows=3, persist_steps=50)
    assert statuses(pol, [25, 25, 25]) == [[], ["OPEN"], []]  # 50 steps after two windows
    assert statuses(pol, [24, 25, 25]) == [[], [], ["OPEN"]]  # 49: the third window opens it


def test_persist_steps_zero_counts_windows_only_and_extra_windows_still_wait():
    assert statuses(DetectionPolicy(persist_windows=2, persist_steps=0), [500, 500]) == [[], ["OPEN"]]
    pol = DetectionPolicy(persist_windows=2, persist_steps=50)
    assert statuses(pol, [500, 500], finding(extra_windows=1)) == [[], ["OPEN"]]


def test_diagnoser_does_not_wait_for_a_function_only_some_ranks_ran():
    d = JobDiagnoser("job", POL)
    rws = rank_windows()
    rws[1] = rank_window(1, world=WORLD, functions=["Model.forward", "gc"])  # a GC pause on rank 1 only
    for cmp in comparisons(rank_windows()):  # every function but the partial "gc"
        d.add("FunctionComparison", cmp, NOW)
    for rw in rws:
        d.add("RankWindow", rw, NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto == T0_WINDOW
    d.add("FunctionComparison", dict(comparisons(rank_windows())[0], function="gc"), NOW + POL.grace_ms)
    assert d.skipped["late_record"] == 1  # its comparator waited out the grace: late, counted


def test_diagnoser_waits_for_a_collective_of_a_group_smaller_than_the_job():
    d = JobDiagnoser("job", POL)
    rws = [rank_window(r, world=WORLD, functions=["Model.forward"] + (["comm:all_reduce:g01"] if r < 2 else []))
           for r in range(WORLD)]
    for cmp in comparisons(rank_windows()):
        d.add("FunctionComparison", cmp, NOW)
    for rw in rws:
        d.add("RankWindow", rw, NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto is None  # the group's comparison comes at once: wait for it
    d.add("FunctionComparison", dict(comparisons(rank_windows())[0], function="comm:all_reduce:g01"), NOW)
    d.poll(NOW)
    assert d.windows.evaluated_upto == T0_WINDOW


def test_an_incident_does_not_resolve_while_its_function_is_compared_without_every_rank_that_sent_it():
    """Windows whose comparison of the incident's function lacks the slow rank's pattern (a
    worker that died had read and committed it) are no clean windows: the incident stays open
    through them and resolves once windows compared with every rank show it gone."""
    pol = DetectionPolicy(window_s=5.0, window_grace_s=3.0, persist_steps=0)
    d, out = JobDiagnoser("job", pol), []
    plan = ["slow"] * 3 + ["gap"] * 3 + ["ok"] * 3  # rank 2 slow, then its pattern lost, then recovered
    for i, what in enumerate(plan):
        wid, now = T0_WINDOW + i, NOW + i * W_MS
        rws = [rank_window(r, window=wid, world=WORLD, steps=45, functions=["Model.forward"]) for r in range(WORLD)]
        for rw in rws:
            d.add("RankWindow", rw, now)
        for f in sorted(set().union(*(pattern_functions(rw) for rw in rws))):
            pats = [pattern(r, f, 20.0 if (r == 2 and what == "slow") else 10.0, window=wid, steps=45,
                            world_size=WORLD) for r in range(WORLD)]
            if what == "gap" and f == "Model.forward":
                pats = [p for p in pats if p["rank"] != 2]
            d.add("FunctionComparison", FunctionComparator("job", f, pol).evaluate(wid, pats), now)
        out += [(i, a["status"]) for a in d.poll(now + 60_000)[0] if a["ranks"] == [2]]
    assert [s for _, s in out] == ["OPEN", "RESOLVED"], out
    assert out[-1][0] >= plan.index("ok")  # resolved after the gap, not in it
