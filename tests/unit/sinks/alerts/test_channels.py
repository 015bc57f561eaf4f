import json

from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.settings import Secret
from perftracker_ml.sinks.alerts.base import Event, Incident, Notification
from perftracker_ml.sinks.alerts.pagerduty import PagerDutyChannel, severity
from perftracker_ml.sinks.alerts.slack import SlackChannel
from perftracker_ml.sinks.alerts.webhook import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookChannel,
    verify_signature,
)


def note(event=Event.OPEN, **kw) -> Notification:
    return Notification(Incident.from_anomaly(samples.anomaly("job-a", **kw)), event,
                        "https://grafana.example")


def test_webhook_signature_verifies_and_rejects_tampering_and_replay():
    req = WebhookChannel("http://x/hook", Secret("k3y")).request(note())
    ts, sig = req.headers[TIMESTAMP_HEADER], req.headers[SIGNATURE_HEADER]
    assert verify_signature("k3y", ts, req.body, sig)
    assert not verify_signature("k3y", ts, req.body + b" ", sig)
    assert not verify_signature("other", ts, req.body, sig)
    assert not verify_signature("k3y", ts, req.body, sig, now=int(ts) + 3600)
    body = json.loads(req.body)
    assert body["event"] == "open" and body["incident"]["ranks"] == [3]
    assert body["delivery_id"] == req.headers[DELIVERY_HEADER]


def test_delivery_id_is_stable_per_incident_event():
    # one incident event: the sample's last_seen defaults to now, in whole seconds, so two calls
    # across a second boundary were two events (a fresh-clone failure, 2026-11-26)
    at = {"last_seen_s": 1_700_000_000.0}
    assert note(**at).delivery_id == note(**at).delivery_id
    assert note(**at).delivery_id != note(Event.RESOLVE, **at).delivery_id


def test_slack_message_says_who_what_why_cost_and_links():
    req = SlackChannel(Secret("https://hooks.slack.com/services/T/B/SECRET")).request(note())
    body = json.loads(req.body)
    text = json.dumps(body["blocks"])
    for needle in ("rank 3", "DataLoader", "arrives last", "18.0 ms per step", "var-job=job-a"):
        assert needle in text
    assert body["text"]
    assert "SECRET" not in repr(req)


def test_slack_escapes_hostile_job_names():
    a = samples.anomaly("<!channel> <http://evil|x>")
    n = Notification(Incident.from_anomaly(a), Event.OPEN)
    body = json.loads(SlackChannel(Secret("http://x")).request(n).body)
    assert "<!channel>" not in json.dumps(body["blocks"])


def test_pagerduty_trigger_and_resolve_share_the_dedup_key():
    ch = PagerDutyChannel(Secret("R0UTING"), "http://pd/v2/enqueue")
    trig = json.loads(ch.request(note()).body)
    assert trig["event_action"] == "trigger" and trig["routing_key"] == "R0UTING"
    for field in ("summary", "source", "severity", "timestamp", "component", "group", "class",
                  "custom_details"):
        assert field in trig["payload"]
    assert trig["payload"]["severity"] in ("critical", "error", "warning", "info")
    res = json.loads(ch.request(note(Event.RESOLVE)).body)
    assert res["event_action"] == "resolve" and res["dedup_key"] == trig["dedup_key"]
    assert "payload" not in res


def test_severity_follows_share_of_step():
    assert severity(60, 100) == "critical" and severity(15, 100) == "error"
    assert severity(1, 100) == "warning"


def test_every_channel_keys_the_resolution_by_the_incident_id_and_says_why():
    rec = {**samples.anomaly("j", incident_id="inc-42", status="RESOLVED"), "resolved_reason": "job finished"}
    n = Notification(Incident.from_anomaly(rec), Event.RESOLVE)
    hook = WebhookChannel("http://x", Secret("s")).request(n)
    body = json.loads(hook.body)
    assert body["dedup_key"] == hook.headers["X-Perftracker-Dedup-Key"] == "inc-42"
    assert body["incident"]["resolved_reason"] == "job finished"
    slack = json.loads(SlackChannel(Secret("https://hooks.example/x")).request(n).body)
    assert slack["metadata"]["event_payload"] == {"dedup_key": "inc-42", "resolved_reason": "job finished"}
    assert "(job finished)" in slack["text"] and any("inc-42" in f["text"] for f in slack["blocks"][1]["fields"])
    pd = json.loads(PagerDutyChannel(Secret("rk"), "http://pd").request(n).body)
    assert pd == {"routing_key": "rk", "dedup_key": "inc-42", "event_action": "resolve"}
