"""What the fault tests assert: rows by key in the store against the sink's input, and deliveries.

The oracle for the store is the sink's input itself: every record on the patterns,
findings and anomalies topics, mapped to rows by the sink's own row builders
(:data:`perftracker_ml.sinks.rows.ROW_BUILDERS`), gives the keys (each table's
``ORDER BY``, the key its ReplacingMergeTree collapses replays on) that must be in
the store, each exactly once after the store's deduplication (``FINAL``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.sinks.rows import ROW_BUILDERS, incident_version
from perftracker_ml.sinks.schema import TABLES

from .harness import read_topic

SINK_INPUT = ("FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly")
Query = Callable[[list[str]], list[list[list]]]  # several SQL statements -> their rows


def key_columns(table: str) -> list[str]:
    return [c.strip() for c in TABLES[table].order_by.strip("()").split(",")]


def _key_sql(table: str) -> str:
    types = dict(TABLES[table].columns)
    return ", ".join(f"toUnixTimestamp64Milli({c})" if types[c].startswith("DateTime64") else c
                     for c in key_columns(table))


def sink_input(conf: dict[str, str], topics: TopicNames) -> dict[str, list[dict]]:
    """Every record the sink was given, by record name (read back from its topics)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for topic, names in ((topics.patterns, ["FunctionPattern"]),
                         (topics.findings, ["RankWindow", "FunctionComparison"]),
                         (topics.anomalies, ["Anomaly"])):
        for name, rec in read_topic(conf, topic, names):
            out[name].append(rec)
    return out


def expected_keys(records: dict[str, list[dict]]) -> dict[str, set[tuple]]:
    """table -> the keys of the rows the sink's row builders make of ``records``."""
    keys: dict[str, set[tuple]] = {t: set() for t in TABLES}
    for name, recs in records.items():
        for rec in recs:
            for table, rows in ROW_BUILDERS[name](rec):
                idx = [TABLES[table].column_names.index(c) for c in key_columns(table)]
                keys[table].update(tuple(row[i] for i in idx) for row in rows)
    return keys


@dataclass
class StoreKeys:
    raw: dict[str, Counter]  # rows per key as written (replays not merged yet)
    final: dict[str, Counter]  # rows per key after the store's deduplication

    def replayed_rows(self) -> int:
        return sum(sum(c.values()) - len(c) for c in self.raw.values())


def store_keys(query: Query) -> StoreKeys:
    sqls = []
    for t in TABLES:
        k = _key_sql(t)
        sqls += [f"SELECT {k}, count() FROM {t} GROUP BY {k}", f"SELECT {k}, count() FROM {t} FINAL GROUP BY {k}"]
    results = query(sqls)
    raw, final = {}, {}
    for i, t in enumerate(TABLES):
        raw[t] = Counter({tuple(r[:-1]): int(r[-1]) for r in results[2 * i]})
        final[t] = Counter({tuple(r[:-1]): int(r[-1]) for r in results[2 * i + 1]})
    return StoreKeys(raw, final)


def assert_store_matches(expected: dict[str, set[tuple]], got: StoreKeys) -> dict[str, int]:
    """Nothing lost (every expected key stored), nothing extra, nothing duplicated after the
    store's deduplication. Returns rows per table (for the figures)."""
    for table, keys in expected.items():
        stored = got.final[table]
        lost = keys - set(stored)
        extra = set(stored) - keys
        dup = {k: n for k, n in stored.items() if n != 1}
        assert not lost, f"{table}: {len(lost)} of {len(keys)} keys lost, e.g. {sorted(lost)[:3]}"
        assert not extra, f"{table}: {len(extra)} keys stored that the sink was never given: {sorted(extra)[:3]}"
        assert not dup, f"{table}: keys stored more than once after FINAL: {list(dup.items())[:3]}"
    return {t: len(k) for t, k in expected.items()}


def assert_incidents_latest(anomalies: list[dict], query: Query) -> None:
    """Each incident's row in ``incidents FINAL`` is its latest version on the topic."""
    latest: dict[str, int] = {}
    for a in anomalies:
        v = incident_version(a["status"], _ms(a["last_seen_ms"]))
        latest[a["incident_id"]] = max(latest.get(a["incident_id"], -1), v)
    rows = query(["SELECT incident_id, version FROM incidents FINAL"])[0]
    stored = {r[0]: int(r[1]) for r in rows}
    assert stored == latest, f"incidents FINAL {stored}, latest versions on the topic {latest}"


def _ms(value: object) -> int:
    """Epoch ms of a decoded timestamp (datetime or int)."""
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)  # type: ignore[arg-type]


def notifications(received: list) -> dict[str, list[str]]:
    """incident id -> events delivered (2xx), in arrival order."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in received:
        body = json.loads(r.body)
        out[body["incident"]["incident_id"]].append(body["event"])
    return dict(out)


def assert_delivered_once_in_order(received: list, anomalies: list[dict]) -> dict[str, list[str]]:
    """Every incident on the anomalies topic was notified: ``open`` once, then ``resolve`` once
    when it resolved; no delivery id twice."""
    delivery_ids = [json.loads(r.body)["delivery_id"] for r in received]
    assert len(delivery_ids) == len(set(delivery_ids)), "a notification was delivered twice"
    got = notifications(received)
    resolved = {a["incident_id"] for a in anomalies if a["status"] == "RESOLVED"}
    want = {a["incident_id"]: ["open", "resolve"] if a["incident_id"] in resolved else ["open"]
            for a in anomalies}
    assert got == want, f"notifications per incident {got}, expected {want}; anomaly records " + str(
        [(a["incident_id"], a["job"], a["status"], a["cause"], a["ranks"], a["function"], a["first_seen_ms"],
          a["last_seen_ms"], a.get("resolved_reason")) for a in anomalies])
    return got
