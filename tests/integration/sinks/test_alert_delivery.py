"""Alert channels against a real local HTTP server."""

from __future__ import annotations

import threading
import time

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.settings import Secret
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher, AlertPolicy
from perftracker_ml.sinks.alerts.pagerduty import PagerDutyChannel
from perftracker_ml.sinks.alerts.slack import SlackChannel
from perftracker_ml.sinks.alerts.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookChannel,
    verify_signature,
)
from perftracker_ml.sinks.alerts.worker import DeliveryPolicy

from .conftest import wait_for
from .receiver import Receiver

pytestmark = pytest.mark.integration

FAST = DeliveryPolicy(timeout_s=2.0, max_attempts=6, retry_base_s=0.05, retry_max_s=0.2, workers=4)


def run(channels, policy: AlertPolicy | None = None) -> AlertDispatcher:
    d = AlertDispatcher(channels, policy or AlertPolicy(delivery=FAST))
    d.start()
    return d


def test_webhook_signature_verifies_at_the_receiver():
    with Receiver() as rx:
        d = run([WebhookChannel(rx.url + "/hook", Secret("s3cret"))])
        d.submit(samples.anomaly("job-sig"))
        wait_for(lambda: rx.received, 10)
        d.stop()
    r = rx.received[0]
    assert verify_signature("s3cret", r.headers[TIMESTAMP_HEADER], r.body, r.headers[SIGNATURE_HEADER])
    assert r.json()["incident"]["job"] == "job-sig"


def test_receiver_failing_three_times_then_recovering_gets_exactly_one_delivery():
    with Receiver(lambda r, n: 500 if n <= 3 else 200) as rx:
        d = run([WebhookChannel(rx.url, Secret("k"))])
        d.submit(samples.anomaly("job-retry"))
        wait_for(lambda: rx.received, 10)
        assert d.drain(5)
        time.sleep(0.3)  # nothing more arrives
        d.stop()
    assert len(rx.attempts) == 4 and len(rx.received) == 1
    assert d.stats()["webhook"]["retries"] == 3


def test_hung_receiver_does_not_stall_other_incidents():
    """The other incidents arrive while the receiver still holds the first one (it is released
    only after they are in): no timing bound, the order proves it."""
    release = threading.Event()

    def behave(r, n):
        if r.json()["incident"]["incident_id"] == "stuck":
            release.wait(120)
        return 200

    with Receiver(behave) as rx:
        d = run([WebhookChannel(rx.url, Secret("k"))],
                AlertPolicy(delivery=DeliveryPolicy(timeout_s=150, max_attempts=1, workers=4)))
        d.submit(samples.anomaly("job-h", incident_id="stuck"))
        for i in range(3):
            d.submit(samples.anomaly("job-h", incident_id=f"fine-{i}"))
        wait_for(lambda: len(rx.received) == 3, 60, 0.01)
        assert not release.is_set()
        assert {r.json()["incident"]["incident_id"] for r in rx.received} == {"fine-0", "fine-1", "fine-2"}
        release.set()
        d.stop()


def test_submit_never_blocks_on_a_dead_channel():
    """A receiver that holds every delivery: 100 submits return while the one worker is stuck in
    the first delivery (they are submitted from a thread joined long before the receiver lets
    go), and what the bounded queue cannot hold is dropped and counted."""
    release = threading.Event()
    with Receiver(lambda r, n: release.wait(120) and 200) as rx:
        d = run([WebhookChannel(rx.url, Secret(""))],
                AlertPolicy(delivery=DeliveryPolicy(timeout_s=150, max_attempts=2, retry_base_s=0.1,
                                                    queue_size=5, workers=1)))
        submitting = threading.Thread(target=lambda: [d.submit(samples.anomaly("job-dead", incident_id=f"i{i}"))
                                                      for i in range(100)])
        submitting.start()
        submitting.join(60)
        assert not submitting.is_alive() and not release.is_set()
        assert d.stats()["webhook"]["dropped"] >= 90
        release.set()
        d.stop(5)


def test_resolve_is_sent_when_the_finding_clears_to_every_channel():
    with Receiver() as rx:
        d = run([WebhookChannel(rx.url + "/hook", Secret("k")),
                 SlackChannel(Secret(rx.url + "/slack")),
                 PagerDutyChannel(Secret("rk"), rx.url + "/pd")])
        d.submit(samples.anomaly("job-r", status="OPEN", last_seen_s=time.time() - 10))
        wait_for(lambda: len(rx.received) == 3, 10)
        d.submit(samples.anomaly("job-r", status="RESOLVED", last_seen_s=time.time()))
        wait_for(lambda: len(rx.received) == 6, 10)
        d.stop()
    by_path: dict[str, list] = {}
    for r in rx.received:
        by_path.setdefault(r.path, []).append(r.json())
    assert [b["event"] for b in by_path["/hook"]] == ["open", "resolve"]
    assert [b["event_action"] for b in by_path["/pd"]] == ["trigger", "resolve"]
    assert by_path["/pd"][0]["dedup_key"] == by_path["/pd"][1]["dedup_key"] == "inc-1"
    assert "Resolved" in by_path["/slack"][1]["text"]
