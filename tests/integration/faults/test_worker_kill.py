"""kill -9 one of two stream workers mid-stream: the other takes over, no anomaly is missed."""

from __future__ import annotations

import time

import pytest
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob

from ..waiting import wait_for
from .checks import (
    assert_delivered_once_in_order,
    assert_incidents_latest,
    assert_store_matches,
    expected_keys,
    notifications,
    sink_input,
    store_keys,
)
from .harness import Traffic, chdb_reader, group_lag, partitions_of, read_topic, stop_workers

pytestmark = pytest.mark.integration

JOBS, RANKS = 4, 4  # inputs (keyed job|rank) and findings (keyed job) spread over both workers
SECONDS = 75  # of job time, sent in real time
SLOW_UNTIL_S = 50  # each job's slow rank recovers here: its incident must resolve after the kill


def test_a_killed_worker_is_taken_over_and_every_anomaly_reaches_store_and_webhook_once(
        deployment, webhook, unique):
    """Two `perftracker worker` processes share 4 running jobs (each with one slow rank that
    recovers at 40 s); once one worker has opened an incident it is killed with SIGKILL.

    Asserted: the survivor is assigned every partition of the input, pattern and findings
    topics and its consumer group's lag on the input returns to 0; every record the workers
    produced for the sink is in the store exactly once by key after the store's
    deduplication (nothing lost, nothing extra), each incident's latest version wins; each
    incident was notified once ``open`` and once ``resolve``, in that order; each job's
    resolved incident names its slow rank. Printed: the takeover time (kill -> every
    partition assigned to the survivor), the time until the survivor had consumed everything
    sent before the takeover, the replayed rows waiting for a merge, and the iterations lost
    (the killed worker's open windows are in memory only).
    """
    d = deployment(ALERTS_WEBHOOK_URL=webhook.url)
    d.start_sink()
    workers = [d.start_worker(), d.start_worker()]
    events = d.topics.events
    wait_for(lambda: all(partitions_of(w.stats().get("assigned", []), events) for w in workers), 180, 0.5,
             lambda: [w.stats().get("assigned") for w in workers])
    jobs = [SyntheticJob(f"kill-{unique}-{i}", ranks=RANKS, seconds=SECONDS, slow_rank=i % RANKS, seed=i,
                         slow_until_s=SLOW_UNTIL_S) for i in range(JOBS)]
    traffic = Traffic(d.kafka_conf, events, jobs)
    traffic.start()

    def opened(w):
        return w.stats().get("counters", {}).get("records_out.Anomaly.OPEN", 0)

    def victim_now():  # the worker that opened an incident; mid-stream at the latest
        first = next((w for w in workers if opened(w)), None)
        return first or (workers[0] if traffic.sent >= len(jobs) * RANKS * SECONDS // 2 else None)
    victim = wait_for(victim_now, 180, 0.2)
    survivor = workers[1 - workers.index(victim)]
    assert traffic.is_alive(), "the kill must happen mid-stream"
    killed_at = time.monotonic()
    victim.kill9()
    everything = set(range(d.partitions))

    def took_over() -> bool:
        assigned = survivor.stats().get("assigned", [])
        return all(partitions_of(assigned, t) == everything
                   for t in (events, d.topics.patterns, d.topics.findings))
    wait_for(took_over, 180, 0.2, lambda: survivor.stats().get("assigned"))
    takeover_s = time.monotonic() - killed_at
    per_second = JOBS * RANKS  # batches: a lag below one second of traffic is a consumer keeping up
    wait_for(lambda: group_lag(d.kafka_conf, d.app_id, [events]) <= per_second, 180, 0.5)
    caught_up_s = time.monotonic() - killed_at
    print(f"\nkilled {victim.name} at {traffic.sent} batches sent; takeover {takeover_s:.1f} s, "
          f"lag recovered {caught_up_s:.1f} s after the kill", flush=True)

    traffic.join(SECONDS + 120)
    assert traffic.failed == 0 and traffic.delivered == traffic.sent
    wait_for(lambda: sum(e.count("resolve") for e in notifications(webhook.received).values()) >= JOBS,
             240, 1.0, lambda: (notifications(webhook.received), [
                 (a["job"], a["status"], a["cause"], a["ranks"]) for _n, a in
                 read_topic(d.kafka_conf, d.topics.anomalies, ["Anomaly"])]))
    final_lag = group_lag(d.kafka_conf, d.app_id, [events])
    stop_workers(d)
    for c in d.components:
        c.stop()
    assert victim.proc.returncode == -9 and survivor.proc.returncode == 0

    records = sink_input(d.kafka_conf, d.topics)
    query = chdb_reader(d.data_dir / "chdb")
    stored = store_keys(query)
    rows = assert_store_matches(expected_keys(records), stored)
    anomalies = records["Anomaly"]
    assert_incidents_latest(anomalies, query)
    delivered = assert_delivered_once_in_order(webhook.received, anomalies)
    resolved = {a["job"]: a["ranks"] for a in anomalies if a["status"] == "RESOLVED"}
    assert resolved == {j.job: [j.slow_rank] for j in jobs}

    sent_steps = sum(len(rec["iterations"]["step"]) for j in jobs for _r, rec in _batches(j))
    print(f"\nworker kill -9: takeover {takeover_s:.1f} s, lag back under 1 s of traffic "
          f"{caught_up_s:.1f} s after the kill; "
          f"{traffic.sent} batches sent, {len(anomalies)} anomaly records ({len(delivered)} incidents, "
          f"{sum(map(len, delivered.values()))} notifications), {sum(rows.values())} keys stored, "
          f"{stored.replayed_rows()} replayed rows awaiting merge; final input lag {final_lag}; iterations stored "
          f"{rows['iterations']} of {sent_steps} sent; incidents "
          f"{sorted({(a['job'][-1], a['cause'], tuple(a['ranks']), a['status']) for a in anomalies})}")


def _batches(job: SyntheticJob):
    from perftracker_ml.deploy.workloads.synthetic import batches

    return batches(job)
