"""The Alertmanager channel's payload and who pages when Alertmanager is configured."""

import base64
import json
from datetime import datetime

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import AlertSettings, Secret, Settings
from perftracker_ml.schemas.settings_checks import check_urls
from perftracker_ml.sinks.alerts.alertmanager import (
    ALERTNAME,
    AlertmanagerChannel,
    alerts_url,
    compact_ranks,
)
from perftracker_ml.sinks.alerts.base import Event, Incident, Notification
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher, AlertPolicy, build_channels

NOW = 1_700_000_000.0


def note(event=Event.OPEN, **kw) -> Notification:
    kw.setdefault("last_seen_s", NOW - 10)
    return Notification(Incident.from_anomaly(samples.anomaly("job-a", **kw)), event, "https://grafana.example")


def channel(**kw) -> AlertmanagerChannel:
    return AlertmanagerChannel("http://am:9093", clock=lambda: NOW, **kw)


def posted(ch: AlertmanagerChannel, n: Notification) -> dict:
    (alert,) = json.loads(ch.request(n).body)
    return alert


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_firing_alert_has_the_labels_annotations_and_times_of_the_incident():
    a = posted(channel(resend_s=60), note())
    assert a["labels"] == {"alertname": ALERTNAME, "training_job": "job-a", "incident_id": "inc-1",
                           "cause": "slow_dataloader", "kind": "straggler", "severity": "error",
                           "host": "node-000", "ranks": "3"}
    assert "job" not in a["labels"]  # Prometheus's target label
    assert ts(a["startsAt"]) == NOW - 110  # the incident's first_seen
    assert ts(a["endsAt"]) == NOW + 4 * 60  # 4 resend intervals ahead
    notes = a["annotations"]
    for needle in ("rank 3 on node-000", "DataLoader", "arrives last", "18.0 ms per step", "15% of"):
        assert needle in notes["description"]
    assert "Slow data loader" in notes["summary"] and "job-a" in notes["summary"]
    start_ms = int((NOW - 110) * 1000) - 300_000
    assert notes["dashboard"] == a["generatorURL"] == (
        f"https://grafana.example/d/perftracker-job/perftracker-job?var-job=job-a&from={start_ms}&to=now")
    assert notes["report"] == "perftracker report --job job-a --out report.html"
    assert notes["time_range"].endswith(" to now")


def test_updates_keep_the_labels_of_the_first_post_so_they_are_one_alert():
    ch = channel()
    first = posted(ch, note())
    worse = posted(ch, note(Event.UPDATE, impact_ms=100.0, rank=12))  # costlier, other ranks
    assert worse["labels"] == first["labels"]
    assert "100.0 ms per step" in worse["annotations"]["description"]  # the news is in the annotations
    assert "rank 12" in worse["annotations"]["description"]


def test_a_resolution_ends_the_alert_now_with_the_same_labels():
    ch = channel()
    opened = posted(ch, note())
    rec = {**samples.anomaly("job-a", status="RESOLVED", last_seen_s=NOW - 5), "resolved_reason": "cleared"}
    done = posted(ch, Notification(Incident.from_anomaly(rec), Event.RESOLVE, "https://grafana.example"))
    assert done["labels"] == opened["labels"]
    assert ts(done["endsAt"]) == NOW and ts(done["startsAt"]) < ts(done["endsAt"])
    assert done["annotations"]["resolved_reason"] == "cleared"
    assert "to=now" not in done["annotations"]["dashboard"]


def test_a_hang_is_critical():
    assert posted(channel(), note(cause="hang"))["labels"]["severity"] == "critical"


def test_auth_basic_or_bearer_never_in_repr():
    basic = channel(username="pt", password=Secret("pw-7")).request(note())
    assert basic.headers["Authorization"] == "Basic " + base64.b64encode(b"pt:pw-7").decode()
    bearer = channel(bearer_token=Secret("t0ken")).request(note())
    assert bearer.headers["Authorization"] == "Bearer t0ken"
    assert "t0ken" not in repr(bearer) and "pw-7" not in repr(basic)
    assert "Authorization" not in channel().request(note()).headers


def test_urls_and_ranks():
    assert alerts_url("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alerts_url("http://am/prefix/api/v2/alerts") == "http://am/prefix/api/v2/alerts"
    assert compact_ranks([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert compact_ranks(range(0, 100, 2), max_runs=4) == "0,2,4,6,…+46"


def test_open_incidents_are_due_again_until_resolved_or_released():
    ch = channel()
    ch.track(note(incident_id="a"), source=("anomalies", 0))
    ch.track(note(incident_id="b"), source=("anomalies", 1))
    assert sorted(n.incident.incident_id for n in ch.due()) == ["a", "b"]
    assert all(n.event is Event.UPDATE for n in ch.due())
    ch.track(note(Event.RESOLVE, incident_id="a", status="RESOLVED"), source=("anomalies", 0))
    assert [n.incident.incident_id for n in ch.due()] == ["b"]
    assert ch.release([("anomalies", 1)]) == 1 and ch.due() == []


def test_with_alertmanager_the_sinks_own_paging_channels_are_off():
    s = AlertSettings(alertmanager_urls="http://am1:9093, http://am2:9093", webhook_url="http://hook",
                      slack_webhook_url=Secret("https://hooks.slack.com/x"), pagerduty_routing_key=Secret("rk"))
    assert [c.name for c in build_channels(s)] == ["webhook", "alertmanager-1", "alertmanager-2"]
    without = AlertSettings(slack_webhook_url=Secret("https://hooks.slack.com/x"), pagerduty_routing_key=Secret("rk"))
    assert [c.name for c in build_channels(without)] == ["slack", "pagerduty"]
    one = AlertSettings(alertmanager_urls="http://am:9093")
    assert [c.name for c in build_channels(one)] == ["alertmanager"]


def test_dispatcher_tracks_firing_incidents_for_the_alertmanager_channel():
    ch = channel()
    d = AlertDispatcher([ch], AlertPolicy())  # workers not started: nothing is sent
    d.submit(samples.anomaly("j", incident_id="x", last_seen_s=NOW - 10), source=("anomalies", 3))
    assert ch.firing() == 1
    assert d.release([("anomalies", 3)]) == 1 and ch.firing() == 0


@pytest.mark.parametrize("alerts, message", [
    (AlertSettings(alertmanager_urls="http://am:9093,am2:9093"), "alerts.alertmanager_urls 'am2:9093'"),
    (AlertSettings(alertmanager_urls="http://am:9093", alertmanager_username="u",
                   alertmanager_bearer_token=Secret("t")), "one, a bearer token or basic auth"),
])
def test_settings_refused(alerts, message):
    with pytest.raises(ConfigError, match=message):
        check_urls(Settings(alerts=alerts))
    check_urls(Settings(alerts=AlertSettings(alertmanager_urls="http://am:9093, https://am2/prefix")))
