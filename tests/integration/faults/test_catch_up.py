"""A 512-rank backlog, produced before the worker starts, is diagnosed as the same data live.

The backlog: `perftracker synth`'s job (:mod:`perftracker_ml.deploy.workloads.synthetic`) of 512 ranks,
rank 37's forward 40 % slower, 25 s of batches that end a minute before the worker starts
(a worker restarted behind the live head). The worker reads it as fast as it goes; before
the job clock (streams/detect/job_clock.py) most ranks looked silent on the wall clock while
their data waited in the backlog, their windows were closed empty and most of their events
dropped as late (83 % in ``python -m benchmarks.catch_up --ranks 512 --wall-clock-only``).

Asserted, from the real worker (tansu, Faust, Avro) and the store (sink, chDB): no event
dropped as late (the worker's ``events_dropped`` counter and every stored RankWindow's
``dropped_events``); every rank's windows stored, each with the steps the same batches give
live (the in-process runner fed them at their send time, the timers ticking between them);
the incidents opened are the ones live opens, and name rank 37 alone.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.kafka_admin import ensure_topics
from perftracker_ml.schemas.record_sets import expanded
from perftracker_ml.schemas.topics import all_topics
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, RANK_WINDOW, Status
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.topology import LocalRunner

from ..waiting import wait_for
from .harness import GRACE_S, WINDOW_S, chdb_reader, read_topic, stop_workers

pytestmark = pytest.mark.integration

RANKS, SECONDS, SLOW_RANK = 512, 25, 37
BEHIND_S = 60  # the backlog's last batch is this old when it is produced
TICK_MS = 500


def backlog(job: str) -> list[tuple[int, dict]]:
    cfg = SyntheticJob(job, ranks=RANKS, seconds=SECONDS, slow_rank=SLOW_RANK, slow_function="forward",
                       slowdown=1.4, seed=7, final=True)
    out = []
    for rank, rec in batches(cfg):
        rec["wall_ns"] -= BEHIND_S * 1_000_000_000
        out.append((rank, rec))
    return out


def live(records: list[tuple[int, dict]], policy: DetectionPolicy) -> tuple[dict, set]:
    """The same batches through the worker path in process, each at its send time: (rank, window) ->
    steps of the RankWindows, and the incidents opened (cause, ranks, function)."""
    windows: dict[tuple[int, int], int] = {}
    incidents: set[tuple[str, tuple[int, ...], str]] = set()

    def keep(name: str, rec: dict) -> dict:
        for one_name, one in expanded(name, rec):  # a record set's records one by one
            if one_name == RANK_WINDOW:
                windows[(int(one["rank"]), int(one["window_id"]))] = int(one["steps"])
            elif one_name == ANOMALY and one["status"] == Status.OPEN:
                incidents.add((one["cause"], tuple(one["ranks"]), one["function"]))
        return rec

    runner = LocalRunner(policy, wire=keep)
    next_tick = None
    for _rank, rec in records:
        now = rec["wall_ns"] // 1_000_000 + 20
        while next_tick is not None and next_tick <= now:
            runner.tick(next_tick)
            next_tick += TICK_MS
        runner.feed(EVENT_BATCH, rec, now)
        next_tick = now + TICK_MS if next_tick is None else next_tick
    for k in range(1, 6):
        runner.tick(now + k * 3 * policy.grace_ms)
    return windows, incidents


def produce(conf: dict, topic: str, records: list[tuple[int, dict]]) -> None:
    codec = Codec(EVENT_BATCH)
    p = Producer({**conf, "linger.ms": 50, "compression.type": "lz4"})
    for rank, rec in records:
        while True:
            try:
                p.produce(topic, key=f"{rec['job']}|{rank}".encode(), value=codec.encode(rec))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0


def differences(stored: dict, live: dict, counters: dict, log_tail: str) -> str:
    """What a failed comparison needs to be explained: per rank whose windows differ, the window ids
    and steps stored and live, with the worker's counters when it was stopped and its log's end."""
    ranks = sorted({r for (r, _w), _s in set(stored.items()) ^ set(live.items())})
    lines = [f"{len(ranks)} ranks differ"]
    for rank in ranks[:5]:
        mine = {w: s for (r, w), s in stored.items() if r == rank}
        theirs = {w: s for (r, w), s in live.items() if r == rank}
        lines.append(f"rank {rank}: stored {len(mine)} windows {min(mine, default=None)}..{max(mine, default=None)}, "
                     f"live {len(theirs)} {min(theirs, default=None)}..{max(theirs, default=None)}; "
                     f"differing {sorted(set(mine.items()) ^ set(theirs.items()))[:12]}")
    lines.append(f"worker counters at stop: {counters}")
    lines.append(f"worker log: ...{log_tail}")
    return "\n".join(lines)


def test_backlog_of_512_ranks_is_diagnosed_as_live_with_no_event_dropped(deployment, unique):
    d = deployment()
    ensure_topics(d.kafka_conf, all_topics(d.prefix, d.partitions))
    job = f"backlog-{unique}"
    records = backlog(job)
    produce(d.kafka_conf, d.topics.events, records)  # all of it before the worker starts
    live_windows, live_incidents = live(records, DetectionPolicy(window_s=WINDOW_S, window_grace_s=GRACE_S))
    assert any(r == (SLOW_RANK,) for _c, r, _f in live_incidents), live_incidents

    d.start_sink()
    worker = d.start_worker()

    def counters() -> dict:
        return worker.stats().get("counters", {})
    wait_for(lambda: counters().get("records_in.EventBatch", 0) >= len(records), 900, 1.0,
             lambda: {k: v for k, v in counters().items() if k.startswith(("records_", "events_"))})

    def opened() -> set:
        return {(a["cause"], tuple(a["ranks"]), a["function"])
                for _n, a in read_topic(d.kafka_conf, d.topics.anomalies, [ANOMALY])
                if a["job"] == job and a["status"] == Status.OPEN}
    def state() -> dict:
        return {"opened": opened(), "live": live_incidents,
                **{k: v for k, v in counters().items() if k.startswith(("records_", "errors"))}}
    wait_for(lambda: opened() >= live_incidents, 180, 2.0, state)
    dropped = {k: v for k, v in counters().items() if k.startswith("events_dropped")}
    folded = {k: v for k, v in counters().items() if k.startswith("batches_folded")}
    at_stop = {k: v for k, v in counters().items() if k.startswith(("records_", "events_", "batches_"))}
    log_tail = worker.tail(3000)
    stop_workers(d)
    for c in d.components:
        c.stop()

    (rows, per_window) = chdb_reader(d.data_dir / "chdb")([
        f"SELECT rank, window_id, steps, dropped_events FROM rank_windows FINAL WHERE job = '{job}'",
        "SELECT window_id, count(), sum(steps), countIf(dropped_events > 0) FROM rank_windows FINAL"
        f" WHERE job = '{job}' GROUP BY window_id ORDER BY window_id"])
    print(f"\nper window (id, ranks, steps, ranks with drops): {per_window}")
    stored = {(int(r), int(w)): int(s) for r, w, s, _ in rows}
    print(f"\nbacklog of {RANKS} ranks x {SECONDS} s ({len(records)} batches): {len(stored)} rank windows "
          f"stored, incidents {sorted(opened())}, worker drops {dropped}")
    assert not any(dropped.values()), dropped
    # the agent folded its chunks column-wise: one at a time only each rank's first batch
    assert folded.get("batches_folded.columnar", 0) > len(records) / 2, folded
    assert max(int(x) for *_, x in rows) == 0  # no RankWindow reports an event dropped
    assert {r for r, _ in stored} == set(range(RANKS))
    # the final batches close every window: the same windows, same steps
    assert stored == live_windows, differences(stored, live_windows, at_stop, log_tail)
    assert opened() == live_incidents
    assert all(r == (SLOW_RANK,) for _c, r, _f in opened())
