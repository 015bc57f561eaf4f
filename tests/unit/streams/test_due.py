"""A timer tick polls only the cores with something due (topology.Cores.due): every record, its
order and every verdict are the same as when each tick polled every core, and a tick with nothing
due polls no core, whatever the number of ranks held."""

from __future__ import annotations

import pytest
from perftracker_ml.deploy.workloads.ranks import MS, TICK_MS, SyntheticRanks
from perftracker_ml.schemas import record_sets
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, RANK_WINDOW, RANK_WINDOW_SET
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer
from perftracker_ml.streams.topology import Cores, LocalRunner

POL = DetectionPolicy()
WALL0 = 1_700_000_000_000 * MS  # a window edge
RANKS, SECONDS, STOPS, STOP_AT = 32, 12, 3, 4  # rank 3 sends nothing after its 4th second (dead)


def _every_core(self, now_ms):
    return self.items()


def run(mode: str) -> list[tuple[str, object]]:
    """The job through the runner: ``live`` (batches at their send time) or ``backlog`` (read a
    minute late, 40 ms of caller clock a batch, the timers ticking every 0.5 s of it); then
    90 s of ticks with nothing fed (the job silent: empty windows, the job's end)."""
    routed: list[tuple[str, object]] = []
    runner = LocalRunner(POL, wire=lambda name, rec: routed.append((name, rec)) or rec)
    sim = SyntheticRanks(RANKS, 10, job="due", wall0_ns=WALL0)
    t0 = WALL0 // MS
    now = t0 + (SECONDS + 60) * 1000 if mode == "backlog" else t0
    next_tick = now + TICK_MS
    for second in range(SECONDS):
        if mode == "live":
            now = t0 + (second + 1) * 1000 + 20
        for r in range(RANKS):
            if r == STOPS and second >= STOP_AT:
                continue
            routed.append(("out", runner.feed(EVENT_BATCH, sim.batch(r, second), now)))
            if mode == "backlog":
                now += 40
                if now >= next_tick:
                    for cores in runner.cores.values():
                        cores.clocks.input_pending(True)
                    routed.append(("out", runner.tick(now)))
                    next_tick = now + TICK_MS
        if mode == "live":
            for k in range(1000 // TICK_MS):
                routed.append(("out", runner.tick(now + k * TICK_MS)))
    for cores in runner.cores.values():
        cores.clocks.input_pending(False)
    for k in range(1, 180):
        routed.append(("out", runner.tick(now + k * TICK_MS)))
    return routed


@pytest.mark.parametrize("mode", ["live", "backlog"])
def test_ticks_polling_only_the_cores_due_route_the_same_records_in_the_same_order(mode, monkeypatch):
    scheduled = run(mode)
    with monkeypatch.context() as m:
        m.setattr(Cores, "due", _every_core)  # before: every tick polled every core
        every = run(mode)
    assert sum(record_sets.size(r) if name == RANK_WINDOW_SET else 1 for name, r in every
               if name in (RANK_WINDOW, RANK_WINDOW_SET)) > RANKS * SECONDS // 5
    assert scheduled == every


def test_a_tick_with_nothing_due_polls_no_core(monkeypatch):
    runner = LocalRunner(POL)
    sim = SyntheticRanks(RANKS, 10, job="due", wall0_ns=WALL0)
    t0 = WALL0 // MS
    for r in range(RANKS):
        runner.feed(EVENT_BATCH, sim.batch(r, 0), t0 + 1020)
    polled = []
    for cores in runner.cores.values():
        original, many = cores.stage.poll, cores.stage.poll_many
        monkeypatch.setattr(cores, "stage", cores.stage.__class__(**{
            **{f: getattr(cores.stage, f) for f in cores.stage.__dataclass_fields__},
            "poll": lambda core, now, flush, original=original: polled.append(core) or original(core, now, flush),
            "poll_many": None if many is None else (
                lambda cs, now, flush, many=many: polled.extend(cs) or many(cs, now, flush))}))
    runner.tick(t0 + 1500)  # window 0 ends at 5 s: nothing closes yet
    assert polled == []
    runner.tick(t0 + 5000 + POL.grace_ms + 1)  # the ranks went quiet a grace past its end: each closes it
    assert sum(isinstance(c, RankSummarizer) for c in polled) == RANKS


def test_a_silent_jobs_cores_are_dropped_idle_after_s_after_its_last_record_every_stage():
    """Every stage forgets a job silent for ``idle_after_s`` (comparators and diagnosers were never
    dropped: their idleness counted from the timer's own last poll)."""
    runner = LocalRunner(POL)
    sim = SyntheticRanks(8, 10, job="idle", wall0_ns=WALL0)
    t0 = WALL0 // MS
    for second in range(12):
        for r in range(8):
            runner.feed(EVENT_BATCH, sim.batch(r, second), t0 + (second + 1) * 1000 + 20)
        runner.tick(t0 + (second + 1) * 1000 + 100)
    last = t0 + 12 * 1000 + 20
    for k in range(1, 120):  # the job went silent: its windows close, nothing more comes
        runner.tick(last + k * TICK_MS)
    held = {name: len(cores.by_key) for name, cores in runner.cores.items()}
    assert held["summarize"] == 8 and held["compare"] > 0 and held["diagnose"] == 1
    idle_ms = int(POL.idle_after_s * 1000)
    runner.tick(last + idle_ms // 2)
    assert runner.cores["compare"].by_key and runner.cores["diagnose"].by_key  # not yet
    for k in range(1, 12):  # a silent rank's empty windows (for hang detection) stop after
        runner.tick(last + idle_ms + 2 * POL.window_ms + k * 1000)  # idle_after_s: then its summarizer goes
    assert len(runner.cores["summarize"].by_key) == 0 and runner.cores["diagnose"].by_key
    for k in range(1, 12):  # the diagnoser's last record was the last empty window
        runner.tick(last + 2 * idle_ms + 4 * POL.window_ms + k * 1000)
    assert {name: len(cores.by_key) for name, cores in runner.cores.items()} == \
        {"summarize": 0, "compare": 0, "diagnose": 0}
