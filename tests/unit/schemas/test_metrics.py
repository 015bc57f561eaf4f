"""The Prometheus exporter: counter sets -> exposition text, per-process registry, tiny server."""

from __future__ import annotations

import urllib.request

import prometheus_client
import pytest
from perftracker_ml.schemas.counters import Counter, CounterSet, Histogram, Kind
from perftracker_ml.schemas.metrics import MetricsServer, exposition, registry_of
from prometheus_client.parser import text_string_to_metric_families


class Things(CounterSet):
    component = "things"

    seen = Counter("things seen")
    lost = Counter("things lost", labels=("job",))
    queued = Counter("things queued now", kind=Kind.GAUGE, initial=-1)
    wait_ms = Histogram("time a thing waited, in ms", buckets=(10, 100), labels=("stage",))


def scrape(*sets: CounterSet, **const: str) -> str:
    body, content_type = exposition(registry_of(*sets, const_labels=const))
    assert content_type.startswith("text/plain")
    return body.decode()


def families(text: str) -> dict[str, prometheus_client.Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_samples_become_typed_families_with_help_and_the_component_in_the_name():
    things = Things()
    things.inc(Things.seen, by=3)
    things.inc(Things.lost, "j1", by=2)
    text = scrape(things)
    assert "# HELP perftracker_things_seen_total things seen" in text
    assert "# TYPE perftracker_things_seen_total counter" in text
    assert "perftracker_things_seen_total 3.0" in text
    assert 'perftracker_things_lost_total{job="j1"} 2.0' in text
    assert "# TYPE perftracker_things_queued gauge" in text and "perftracker_things_queued -1.0" in text
    parsed = families(text)
    assert parsed["perftracker_things_seen"].type == "counter"
    assert parsed["perftracker_things_queued"].type == "gauge"


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    things = Things()
    for ms in (5, 10, 50, 1000):
        things.observe(Things.wait_ms, ms, "flush")
    fam = families(scrape(things))["perftracker_things_wait_ms"]
    assert fam.type == "histogram"
    values = {(s.name, s.labels.get("le", "")): s.value for s in fam.samples}
    assert values[("perftracker_things_wait_ms_bucket", "10")] == 2  # le is inclusive
    assert values[("perftracker_things_wait_ms_bucket", "100")] == 3
    assert values[("perftracker_things_wait_ms_bucket", "+Inf")] == 4
    assert values[("perftracker_things_wait_ms_sum", "")] == 1065
    assert values[("perftracker_things_wait_ms_count", "")] == 4


def test_label_values_are_escaped_and_const_labels_added():
    things = Things()
    nasty = 'a "quoted"\\job\nwith a newline'
    things.inc(Things.lost, nasty)
    text = scrape(things, rank="3")
    assert 'job="a \\"quoted\\"\\\\job\\nwith a newline"' in text
    (sample,) = families(text)["perftracker_things_lost"].samples
    assert sample.labels == {"job": nasty, "rank": "3"}


def test_values_are_read_at_scrape_time_and_removed_series_disappear():
    things = Things()
    registry = registry_of(things)
    things.inc(Things.lost, "gone")
    assert 'job="gone"' in exposition(registry)[0].decode()
    things.remove(Things.lost, "gone")
    things.inc(Things.seen)
    text = exposition(registry)[0].decode()
    assert 'job="gone"' not in text and "perftracker_things_seen_total 1.0" in text


def test_no_global_registry_is_used():
    things = Things()
    things.inc(Things.seen)
    a, b = registry_of(things), registry_of(things)  # two registries of one set: no clash
    assert a is not b and a is not prometheus_client.REGISTRY
    assert "perftracker_things" in exposition(a)[0].decode()
    assert b"perftracker_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)
    own = exposition(a)[0].decode()
    assert "process_cpu_seconds" not in own and "python_gc" not in own  # the default collectors


def test_server_binds_localhost_serves_metrics_and_frees_its_port():
    things = Things()
    things.inc(Things.seen, by=7)
    server = MetricsServer(registry_of(things), 0)
    try:
        assert server.host == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            assert "perftracker_things_seen_total 7.0" in resp.read().decode()
    finally:
        server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)
    server.close()  # idempotent


def test_every_exported_metric_is_documented():
    from pathlib import Path

    from perftracker_ml.collectors.counters import CollectorCounters
    from perftracker_ml.collectors.relay_server import RelayCounters
    from perftracker_ml.sinks.alerts.worker import AlertCounters
    from perftracker_ml.sinks.service import SinkCounters
    from perftracker_ml.streams.context import StreamCounters

    doc = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    for cls in (StreamCounters, SinkCounters, AlertCounters, CollectorCounters, RelayCounters):
        for c in cls.declared:
            name = f"perftracker_{cls.component}_{c.name}" + ("_total" if c.kind is Kind.COUNTER else "")
            assert f"| `{name}` | {c.kind.value} |" in doc, f"document {name} in docs/operations.md"
