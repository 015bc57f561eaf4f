from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.sinks.alerts.base import Event, Incident
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher, AlertPolicy


class NullChannel:
    name = "null"

    def request(self, n):  # never called: workers are not started
        raise AssertionError


def dispatcher(**kw) -> AlertDispatcher:
    return AlertDispatcher([NullChannel()], AlertPolicy(**kw))


def decide(d: AlertDispatcher, now: float, **kw):
    return d._decide(Incident.from_anomaly(samples.anomaly("j", **kw)), now)


def test_lifecycle_open_update_rate_limited_resolve():
    d = dispatcher(update_interval_s=60)
    assert decide(d, 0, status="OPEN", last_seen_s=1000) is Event.OPEN
    assert decide(d, 1, status="OPEN", last_seen_s=1000) is None  # exact replay
    assert decide(d, 2, status="UPDATED", last_seen_s=1005) is None  # rate limited
    assert d.suppressed == 1
    assert decide(d, 61, status="UPDATED", last_seen_s=1010) is Event.UPDATE
    assert decide(d, 62, status="RESOLVED", last_seen_s=1015) is Event.RESOLVE
    assert decide(d, 63, status="RESOLVED", last_seen_s=1015) is None  # replayed resolve
    assert decide(d, 64, status="OPEN", last_seen_s=2000) is Event.OPEN  # it came back


def test_below_min_impact_never_pages():
    d = dispatcher(min_impact_ms_per_step=50)
    assert decide(d, 0, impact_ms=5) is None
    assert decide(d, 1, impact_ms=5, status="RESOLVED") is None


def test_resolve_of_an_incident_opened_before_a_restart_is_sent():
    assert decide(dispatcher(), 0, status="RESOLVED", last_seen_s=1000) is Event.RESOLVE


def test_update_of_unknown_incident_opens_it():
    d = dispatcher()
    assert decide(d, 0, status="UPDATED", last_seen_s=1000) is Event.OPEN


def test_no_channels_means_nothing_to_do():
    assert AlertDispatcher([]).submit(samples.anomaly("j")) is None


def test_resolution_goes_out_once_whatever_follows():
    """A job's end after the incident resolved, or a replay with another last_seen: once."""
    d = dispatcher()
    assert decide(d, 0, status="OPEN", last_seen_s=1000) is Event.OPEN
    assert decide(d, 1, status="RESOLVED", last_seen_s=1005) is Event.RESOLVE
    assert decide(d, 2, status="RESOLVED", last_seen_s=1010) is None
    assert decide(d, 3, status="RESOLVED", last_seen_s=1005) is None
    assert decide(d, 4, status="OPEN", last_seen_s=2000) is Event.OPEN  # it came back: resolvable again
    assert decide(d, 5, status="RESOLVED", last_seen_s=2005) is Event.RESOLVE


def test_a_replayed_history_after_the_resolution_does_not_open_it_again():
    """A worker that took over re-sends the incident's records from its last committed offsets:
    OPEN and UPDATED no later than the resolution are history; data after it opens it again."""
    d = dispatcher()
    assert decide(d, 0, status="OPEN", last_seen_s=1000) is Event.OPEN
    assert decide(d, 1, status="RESOLVED", last_seen_s=1010) is Event.RESOLVE
    assert decide(d, 2, status="OPEN", last_seen_s=1000) is None  # the replay
    assert decide(d, 3, status="UPDATED", last_seen_s=1005) is None
    assert decide(d, 4, status="RESOLVED", last_seen_s=1010) is None
    assert decide(d, 5, status="RESOLVED", last_seen_s=1020) is None  # the job's end, later
    assert decide(d, 6, status="OPEN", last_seen_s=1015) is None  # before that end: still history
    assert decide(d, 7, status="OPEN", last_seen_s=1030) is Event.OPEN  # new data: it came back
    assert decide(d, 8, status="RESOLVED", last_seen_s=1040) is Event.RESOLVE


def test_advice_about_the_jobs_shape_never_pages():
    """A record of kind "advice" (a stage imbalance seen from the job's start) is stored, never sent."""
    d = dispatcher()
    advice = dict(samples.anomaly("j", status="OPEN", last_seen_s=1000), kind="advice", cause="stage_imbalance")
    assert d.submit(advice) is None and d.skipped == 1
    incident = dict(advice, kind="imbalance", incident_id="other")
    assert d._decide(Incident.from_anomaly(incident), 0) is Event.OPEN  # the same cause as a change pages
