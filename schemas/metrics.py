"""Prometheus metrics of a process's counter sets: a custom collector, a registry, a tiny server.

Every component declares its counters once (:mod:`.counters`); this module
turns their :meth:`~.counters.CounterSet.samples` into Prometheus metric
families at scrape time, nothing per event. Names are
``perftracker_<component>_<counter>`` (``_total`` added to counters), help
and type come from the declaration, labels from the declared label names
plus the ``const_labels`` given (a collector's job and rank).

No global state: each process builds its own ``CollectorRegistry`` with
:func:`registry_of` (the library's default registry, with its process and GC
collectors, is never touched). ``prometheus_client`` is imported only when a
registry is built, so importing this module costs nothing and the slim
collector install works without it (:func:`registry_of` then raises
ImportError, which the collector turns into one log line).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .counters import CounterSet, Kind, Sample

PREFIX = "perftracker"
DEFAULT_HOST = "127.0.0.1"


def metric_name(sample: Sample) -> str:
    """The metric family's name: ``perftracker_<component>_<counter>``."""
    return f"{PREFIX}_{sample.component}_{sample.name}"


class CounterSetCollector:
    """A prometheus_client collector (its one-method protocol, ``collect()``) over counter sets."""

    def __init__(self, sets: Sequence[CounterSet], const_labels: Mapping[str, str] | None = None):
        self.sets = tuple(sets)
        self.const_labels = dict(const_labels or {})

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        families: dict[str, Metric] = {}
        for counter_set in self.sets:
            for sample in counter_set.samples():
                name = metric_name(sample)
                family = families.get(name)
                if family is None:
                    family = families[name] = Metric(name, sample.help, sample.kind.value)
                suffix = sample.suffix or ("_total" if sample.kind is Kind.COUNTER else "")
                family.add_sample(name + suffix, {**self.const_labels, **dict(sample.labels)},
                                  float(sample.value))
        yield from families.values()


def registry_of(*sets: CounterSet, const_labels: Mapping[str, str] | None = None) -> Any:
    """A new ``CollectorRegistry`` exporting ``sets`` (raises ImportError without prometheus-client)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CounterSetCollector(sets, const_labels))  # type: ignore[arg-type]
    return registry


def exposition(registry: Any) -> tuple[bytes, str]:
    """The text exposition format of ``registry`` and its content type, for an HTTP answer."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """``GET /metrics`` of one registry, served by prometheus_client in a daemon thread."""

    def __init__(self, registry: Any, port: int, host: str = DEFAULT_HOST):
        from prometheus_client import start_http_server

        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port = int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
