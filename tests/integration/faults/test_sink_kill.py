"""kill -9 the sink while it writes, restart it: nothing lost, nothing duplicated in the store."""

from __future__ import annotations

import time

import pytest
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob

from ..waiting import wait_for
from .checks import (
    assert_incidents_latest,
    assert_store_matches,
    expected_keys,
    sink_input,
    store_keys,
)
from .harness import Traffic, chdb_reader, partitions_of, read_topic, stop_workers

pytestmark = pytest.mark.integration

KILLS = 3  # the sink is killed this many times while the stream runs, restarted after each


def test_sink_killed_mid_flush_and_restarted_loses_and_duplicates_nothing(deployment, unique):
    """A worker turns 2 jobs (8 ranks, 90 s of job time sent in 60 s) into the sink's input
    while the sink flushes every 50 ms (so a flush is in progress most of the time); the sink
    is killed with SIGKILL 3 times, each time once it has flushed and holds rows taken but not
    confirmed written, and restarted at once on the same chDB directory.

    Asserted (after the last sink stopped cleanly): the store holds every key the sink's input
    maps to, in every table, exactly once after the store's deduplication, and nothing else;
    each incident's latest version wins. The jobs end cleanly (each rank's last batch is
    ``final``), so every step sent is stored, the last, partial window's included, each rank's
    last window says ``ended_cleanly``, and the open incidents are resolved "job finished". Printed: rows pending at each kill, restart time
    (kill -> new sink consuming), rows replayed (written twice, collapsed by the tables'
    ReplacingMergeTree).
    """
    d = deployment(STORE_FLUSH_INTERVAL_S="0.05")
    sink = d.start_sink()
    worker = d.start_worker()
    wait_for(lambda: partitions_of(worker.stats().get("assigned", []), d.topics.events), 180, 0.5)
    # long enough that three kills, each waiting for a flush in progress, and three restarts on a
    # loaded machine all fall while the stream still runs (with 30 s of traffic, one CI run found no
    # flush in progress before its third kill: the stream had ended)
    jobs = [SyntheticJob(f"sinkkill-{unique}-{i}", ranks=8, seconds=90, slow_rank=3 + i, seed=i, final=True)
            for i in range(2)]
    traffic = Traffic(d.kafka_conf, d.topics.events, jobs, speed=1.5)
    traffic.start()
    pending, restarts = [], []
    for _ in range(KILLS):
        def writing(s=sink):
            st = s.stats()
            return st if st and st["flushes"] >= 1 and st["rows_buffered"] > st["rows_written"] else None
        st = wait_for(writing, 180, 0.01, lambda s=sink: {"kills": len(pending), "traffic_running": traffic.is_alive(),
                                                   "restarts_s": restarts, "sink": s.stats()})
        sink.kill9()
        killed_at = time.monotonic()
        assert sink.proc.returncode == -9
        pending.append(st["rows_buffered"] - st["rows_written"])
        sink = d.start_sink()
        restarts.append(time.monotonic() - killed_at)
    traffic.join(120)
    assert traffic.failed == 0 and traffic.delivered == traffic.sent
    wait_for(lambda: jobs_ended(d, jobs), 180, 1.0)  # the worker saw every final batch through
    stop_workers(d)
    assert sink.stop() == 0

    records = sink_input(d.kafka_conf, d.topics)
    query = chdb_reader(d.data_dir / "chdb")
    stored = store_keys(query)
    rows = assert_store_matches(expected_keys(records), stored)
    assert_incidents_latest(records["Anomaly"], query)
    assert {a["job"] for a in records["Anomaly"]} == {j.job for j in jobs}
    assert_every_step_stored(traffic, query, jobs)
    print(f"\nsink kill -9 x{KILLS}: rows pending at each kill {pending}, restarts {[round(r, 1) for r in restarts]} s; "
          f"{sum(len(v) for v in records.values())} records in, {sum(rows.values())} keys stored "
          f"({rows}), 0 lost, 0 duplicated after FINAL, {stored.replayed_rows()} rows replayed")


def jobs_ended(d, jobs: list[SyntheticJob]) -> bool:
    """Each job's end is on pt.anomalies: its open incidents RESOLVED "job finished"."""
    done = {r["job"] for _, r in read_topic(d.kafka_conf, d.topics.anomalies, ["Anomaly"], timeout_s=30)
            if r.get("resolved_reason") == "job finished"}
    return done >= {j.job for j in jobs}


def assert_every_step_stored(traffic: Traffic, query, jobs: list[SyntheticJob]) -> None:
    """Every step of every rank the traffic sent is in ``iterations`` (nothing left in an open
    window at the end), each rank's last window is marked ended_cleanly, and every incident
    ended: the job's end resolved it "job finished" (or it cleared before)."""
    names = ", ".join(f"'{j.job}'" for j in jobs)
    steps, ended, open_incidents, reasons = query([
        f"SELECT job, rank, step FROM iterations FINAL WHERE job IN ({names})",
        f"SELECT job, rank, argMax(ended_cleanly, window_id) FROM rank_windows FINAL WHERE job IN ({names})"
        " GROUP BY job, rank",
        f"SELECT incident_id FROM incidents FINAL WHERE job IN ({names}) AND status != 'RESOLVED'",
        f"SELECT DISTINCT resolved_reason FROM incidents FINAL WHERE job IN ({names})"])
    sent: dict[tuple[str, int], set[int]] = {}
    for (job, rank, _seq), batch_steps in traffic.steps.items():
        sent.setdefault((job, rank), set()).update(batch_steps)
    stored: dict[tuple[str, int], set[int]] = {}
    for job, rank, step in steps:
        stored.setdefault((job, int(rank)), set()).add(int(step))
    missing = {k: sorted(v - stored.get(k, set())) for k, v in sent.items() if v - stored.get(k, set())}
    assert not missing, f"steps sent but not stored: {missing}"
    assert sum(len(v) for v in sent.values()) == sum(len(v) for v in stored.values())
    assert sorted((j, int(r)) for j, r, _ in ended) == sorted(sent) and all(int(e) for _, _, e in ended), ended
    assert open_incidents == [], "incidents still open after the jobs ended"
    assert {r[0] for r in reasons} <= {"job finished", "cleared"} and ["job finished"] in reasons, reasons
