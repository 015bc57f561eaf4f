"""The broker restarts (tansu keeps topics in memory: they vanish): everyone reconnects by
themselves, and what was lost shows in the per-rank gap counters."""

from __future__ import annotations

import os
import signal
import time

import pytest
from confluent_kafka.admin import AdminClient
from perftracker_ml.deploy.tansu import start_broker
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob
from perftracker_ml.schemas.topics import all_topics

from ..waiting import wait_for
from .harness import Traffic, chdb_reader, partitions_of, stop_workers

pytestmark = pytest.mark.integration

STALL_S = 3.0  # the worker is paused this long before the broker dies: what it had not read is lost
OUTAGE_S = 5.0  # broker down
RANKS, SECONDS = 8, 50


def _topics_back(conf: dict[str, str], prefix: str, partitions: int) -> bool:
    have = {n: len(t.partitions) for n, t in AdminClient(conf).list_topics(timeout=5).topics.items()}
    return all(have.get(t.name) for t in all_topics(prefix, partitions))


def test_broker_restart_everyone_reconnects_and_every_lost_batch_is_counted(tmp_path, deployment, unique):
    """One job (8 ranks, 50 s in real time) runs through a worker and the sink on a broker of
    this test's own. Mid-stream the worker is paused for 3 s (SIGSTOP: a stalled consumer), the
    broker is stopped, the worker resumed, and after 5 s a new broker (no topics) starts on the
    same port. Nobody but the perftracker processes creates topics.

    Asserted: the topics come back, the producer, the worker and the sink deliver, consume and
    write again by themselves (same processes, none died); every rank has steps stored from
    after the restart; the broker kept batches the worker never read, and every rank counts
    them (``lost_batches``, from gaps in the batch sequence numbers); the steps missing from
    the store (every step sent, the job's last window included: it ends with final batches)
    are no more than the lost batches held plus the events counted as dropped
    (``dropped_events`` includes what came too late for its window, which a paused pipeline
    causes) plus the steps of the RankWindows missing between the worker and the store (a
    restarted tansu acknowledges what arrives before its topics exist again and keeps none of
    it: a window the worker wrote then is gone, and shown as missing); the ``rank_health``
    query shows those counters and the missing RankWindows. Printed: batches sent and consumed, steps missing and
    counters per rank, RankWindows missing, and the time from the broker's return until the
    topics existed and the worker and the sink consumed again.
    """
    brokers = [start_broker(log_path=tmp_path / "tansu-0.log")]
    try:
        _restart_scenario(tmp_path, brokers, deployment, unique)
    finally:
        brokers[-1].stop()


def _restart_scenario(tmp_path, brokers, deployment, unique) -> None:
    port = brokers[0].port
    d = deployment(bootstrap=brokers[0].bootstrap)
    sink = d.start_sink()
    worker = d.start_worker()
    wait_for(lambda: partitions_of(worker.stats().get("assigned", []), d.topics.events), 180, 0.5)
    job = SyntheticJob(f"restart-{unique}", ranks=RANKS, seconds=SECONDS, slow_rank=5, final=True)
    traffic = Traffic(d.kafka_conf, d.topics.events, [job])
    traffic.start()

    def consumed() -> int:
        return worker.stats().get("counters", {}).get("records_in.EventBatch", 0)
    wait_for(lambda: consumed() >= RANKS * 15, 120, 0.5)
    os.kill(worker.proc.pid, signal.SIGSTOP)
    time.sleep(STALL_S)
    brokers[0].stop()
    os.kill(worker.proc.pid, signal.SIGCONT)
    time.sleep(OUTAGE_S)
    brokers.append(start_broker(port=port, log_path=tmp_path / "tansu-1.log"))
    back_at, restart_wall_ms = time.monotonic(), time.time_ns() // 1_000_000
    worker_seen, sink_seen = consumed(), sink.stats().get("consumed", 0)
    wait_for(lambda: _topics_back(d.kafka_conf, d.prefix, d.partitions), 60, 0.2)
    topics_s = time.monotonic() - back_at
    wait_for(lambda: consumed() > worker_seen, 120, 0.2)
    worker_s = time.monotonic() - back_at
    wait_for(lambda: sink.stats().get("consumed", 0) > sink_seen, 120, 0.2)
    sink_s = time.monotonic() - back_at
    traffic.join(SECONDS + 120)
    wait_for(lambda: worker.stats().get("counters", {}).get("ranks_ended", 0) >= RANKS, 120, 0.5)  # final batches in
    received = consumed()
    stop_workers(d)
    assert sink.stop() == 0 and worker.proc.returncode == 0, "a process died instead of reconnecting"

    query = chdb_reader(d.data_dir / "chdb")
    health_sql = _rank_health_sql().replace("{job:String}", f"'{job.job}'").replace("{minutes:UInt32}", "600")
    counted_rows, step_rows, after_rows, health_rows, window_rows = query([
        f"SELECT rank, max(lost_batches), max(dropped_events) FROM rank_windows FINAL"
        f" WHERE job = '{job.job}' GROUP BY rank",
        f"SELECT rank, step FROM iterations FINAL WHERE job = '{job.job}'",
        f"SELECT DISTINCT rank FROM rank_windows FINAL WHERE job = '{job.job}' AND steps > 0"
        f" AND toUnixTimestamp64Milli(window_start) > {restart_wall_ms}",
        f"SELECT rank, lost_batches, dropped_events, missing_windows FROM ({health_sql})",
        f"SELECT rank, max(window_id) - min(window_id) + 1 - count(), max(steps) FROM rank_windows FINAL"
        f" WHERE job = '{job.job}' GROUP BY rank"])
    holes = {int(r): int(n) for r, n, _ in window_rows}
    window_steps = {int(r): int(s) for r, _, s in window_rows}
    counted = {int(r): (int(lost), int(dropped)) for r, lost, dropped in counted_rows}
    stored: dict[int, set[int]] = {}
    for r, step in step_rows:
        stored.setdefault(int(r), set()).add(int(step))
    assert {int(r[0]) for r in after_rows} == set(range(RANKS)), "a rank stored nothing after the restart"
    per_batch = max(len(steps) for steps in traffic.steps.values())
    missing, gaps = {}, {}
    for rank in range(RANKS):  # every step sent: the final batches closed the last windows too
        sent = {s for (_j, r, _q), steps in traffic.steps.items() if r == rank for s in steps}
        gone = sorted(sent - stored[rank])
        missing[rank] = len(gone)
        gaps[rank] = _ranges(gone)
    print(f"\nbroker restart: {traffic.sent} batches sent ({traffic.failed} failed at the producer), "
          f"{received} consumed by the worker; per rank: steps missing {missing}, "
          f"(lost batches, dropped events) counted {counted}; back after the broker returned: "
          f"topics {topics_s:.1f} s, worker {worker_s:.1f} s, sink {sink_s:.1f} s; RankWindows missing {holes}")
    assert traffic.sent > received, "the stalled worker should have lost what the dead broker held"
    for rank in range(RANKS):
        lost, dropped = counted[rank]
        assert lost > 0, f"rank {rank}: the batches the dead broker held are not counted as lost"
        in_holes = holes[rank] * window_steps[rank]
        assert missing[rank] <= lost * per_batch + dropped + in_holes, \
            f"rank {rank}: {missing[rank]} steps missing ({gaps[rank]}), only {lost} lost batches, " \
            f"{dropped} dropped events and {holes[rank]} missing RankWindows (<= {in_holes} steps) counted; " \
            f"batches (seq: steps) {_batch_spans(traffic, rank)}"
    assert {int(r): (int(lost), int(dropped)) for r, lost, dropped, _ in health_rows} == counted
    assert {int(r[0]): int(r[3]) for r in health_rows} == holes  # RankWindows lost on the way: shown too


def _rank_health_sql() -> str:
    from perftracker_ml.sinks.queries import QUERIES

    return QUERIES["rank_health"].sql


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def _batch_spans(traffic: Traffic, rank: int) -> dict[int, tuple[int, int]]:
    return {q: (min(st), max(st)) for (_j, r, q), st in traffic.steps.items() if r == rank and st}
