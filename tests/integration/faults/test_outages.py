"""The store and the webhook receiver are both unavailable for 60 s, then back."""

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
from .harness import Traffic, partitions_of, server_reader, stop_workers

pytestmark = pytest.mark.integration

OUTAGE_S = 60.0  # the figure; both outages run at the same time to keep the suite short
JOBS, RANKS = 3, 4
SECONDS = 80  # of job time, sent in real time: traffic runs before, during and after the outage
SLOW_UNTIL_S = 35  # incidents open (~20 s) and resolve (~50 s) while both are down


def test_store_and_webhook_down_60s_then_back_every_row_and_incident_arrives_once(
        deployment, webhook, clickhouse, unique):
    """The sink writes to a ClickHouse server (``clickhouse://``: the sink's own server code path,
    clickhouse-connect over HTTP) and notifies a webhook; 3 jobs (4 ranks, one slow rank each,
    recovering at 35 s of job time) run through a worker. 5 s into the jobs, once rows were
    written, the store server and the webhook receiver are both stopped (connections refused)
    for 60 s, then started again on the same ports, the store with its data: the incidents
    open and resolve while both are down.

    The store is :mod:`.chserver`, ClickHouse's HTTP interface over chDB in its own process:
    no ClickHouse server binary is installed here, and the default chDB store lives inside
    the sink process, where it cannot be taken away without killing the sink (that is
    test_sink_kill). Stopping that server is what a ClickHouse outage looks like to the sink.

    Asserted: every key the sink's input maps to is stored exactly once after the store's
    deduplication and nothing else, each incident's latest version wins; every incident was
    notified ``open`` once and ``resolve`` once, in that order, none twice. Printed: rows and
    notifications held during the outage and the time from the end of the outage until the
    store had every row and the receiver every notification.
    """
    d = deployment(STORE_URL=clickhouse.url, ALERTS_WEBHOOK_URL=webhook.url)
    sink = d.start_sink()
    worker = d.start_worker()
    wait_for(lambda: partitions_of(worker.stats().get("assigned", []), d.topics.events), 180, 0.5)
    jobs = [SyntheticJob(f"outage-{unique}-{i}", ranks=RANKS, seconds=SECONDS, slow_rank=i % RANKS,
                         seed=i, slow_until_s=SLOW_UNTIL_S) for i in range(JOBS)]
    traffic = Traffic(d.kafka_conf, d.topics.events, jobs)
    traffic.start()
    wait_for(lambda: traffic.sent >= JOBS * RANKS * 5 and sink.stats().get("rows_written"), 180, 0.2)
    clickhouse.stop()
    webhook.stop()
    during = len(webhook.received), sink.stats()
    time.sleep(OUTAGE_S)
    held = sink.stats()
    assert held["rows_buffered"] > during[1]["rows_written"] and held["flush_failures"] > 0
    clickhouse.start()
    webhook.start()
    back_at = time.monotonic()

    def store_has_everything() -> bool:
        st = sink.stats()
        return st["rows_written"] >= held["rows_buffered"]
    wait_for(store_has_everything, 180, 0.2, sink.stats)
    store_s = time.monotonic() - back_at
    opened = {a for a, ev in notifications(webhook.received).items() if ev}
    traffic.join(SECONDS + 120)
    wait_for(lambda: sum(e.count("resolve") for e in notifications(webhook.received).values()) >= JOBS,
             240, 0.5, lambda: (notifications(webhook.received), sink.stats()))
    stop_workers(d)
    assert sink.stop() == 0

    records = sink_input(d.kafka_conf, d.topics)
    query = server_reader(clickhouse.url)
    stored = store_keys(query)
    rows = assert_store_matches(expected_keys(records), stored)
    anomalies = records["Anomaly"]
    assert_incidents_latest(anomalies, query)
    delivered = assert_delivered_once_in_order(webhook.received, anomalies)
    assert {a["job"] for a in anomalies if a["status"] == "RESOLVED"} == {j.job for j in jobs}
    print(f"\nstore and webhook down {OUTAGE_S:.0f} s: {held['rows_buffered'] - during[1]['rows_written']} rows "
          f"held by the sink ({held['flush_failures']} failed flushes), store caught up {store_s:.1f} s after "
          f"it returned; {during[0]} notifications before the outage, {len(opened)} incidents notified by "
          f"then, {sum(map(len, delivered.values()))} in all; {sum(rows.values())} keys stored, "
          f"{stored.replayed_rows()} replayed rows awaiting merge")
