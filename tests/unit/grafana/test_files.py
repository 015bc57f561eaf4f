"""Dashboards and provisioning files parse and carry what Grafana requires."""

from __future__ import annotations

import re

from perftracker_ml.grafana import build
from perftracker_ml.grafana.dashboards import load_dashboards, load_provisioning, panel_queries

DS_UID = "perftracker-clickhouse"
DS_TYPE = "grafana-clickhouse-datasource"
PROM_UID = "perftracker-prometheus"
PROM_TYPE = "prometheus"
DATASOURCES = {DS_UID: DS_TYPE, PROM_UID: PROM_TYPE}  # the provisioned ones


def test_dashboard_files_are_generated_from_build():
    files = load_dashboards()
    for name, text in build.render_all().items():
        assert build.json.loads(text) == files[name], f"run python -m perftracker_ml.grafana.build ({name})"


def test_dashboards_have_the_fields_grafana_requires():
    uids = set()
    for name, d in load_dashboards().items():
        for key in ("uid", "title", "panels", "schemaVersion", "templating", "time"):
            assert key in d, (name, key)
        assert len(d["uid"]) <= 40 and d["uid"] not in uids
        uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in d["panels"]:
            assert {"type", "title", "gridPos", "targets", "datasource"} <= set(p), (name, p.get("title"))
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            assert DATASOURCES.get(p["datasource"]["uid"]) == p["datasource"]["type"], (name, p["title"])
        for p, t in panel_queries(d):
            assert t["refId"] and t["datasource"] == p["datasource"]
            if t["datasource"]["uid"] == DS_UID:
                assert t["rawSql"].strip() and t["editorType"] == "sql"
            else:
                assert t["expr"].strip()


def test_every_variable_a_query_uses_is_defined():
    for name, d in load_dashboards().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        texts = [t.get("rawSql") or t["expr"] for _, t in panel_queries(d)] + \
            [v["query"] for v in d["templating"]["list"]]
        for sql in texts:
            used = {m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(?!__)(\w+)", sql)}
            assert used <= defined, (name, used - defined)


def test_job_view_has_the_panels_on_call_needs():
    titles = " | ".join(p["title"] for p in load_dashboards()["job.json"]["panels"]).lower()
    for needle in ("step time per rank", "rank x function", "late arrivals", "sm clock", "temperature",
                   "throttling", "incidents and evidence"):
        assert needle in titles
    names = {v["name"] for v in load_dashboards()["job.json"]["templating"]["list"]}
    assert names == {"job", "host", "rank"}


def exported_metric_names() -> set[str]:
    """Every sample name the workers, the sink and the collectors export."""
    from perftracker_ml.collectors.counters import CollectorCounters
    from perftracker_ml.schemas.counters import Histogram, Kind
    from perftracker_ml.sinks.alerts.worker import AlertCounters
    from perftracker_ml.sinks.service import SinkCounters
    from perftracker_ml.streams.context import StreamCounters

    names = set()
    for cls in (StreamCounters, SinkCounters, AlertCounters, CollectorCounters):
        for c in cls.declared:
            base = f"perftracker_{cls.component}_{c.name}"
            suffixes = ("_bucket", "_sum", "_count") if isinstance(c, Histogram) else \
                ("_total",) if c.kind is Kind.COUNTER else ("",)
            names |= {base + suffix for suffix in suffixes}
    return names


def test_health_dashboard_uses_only_exported_metrics():
    d = load_dashboards()["health.json"]
    exprs = [t["expr"] for _, t in panel_queries(d)]
    assert exprs and all(p["datasource"]["uid"] == PROM_UID for p in d["panels"])
    used = {m for e in exprs for m in re.findall(r"\bperftracker_\w+", e)}
    assert used and used <= exported_metric_names(), used - exported_metric_names()
    titles = " | ".join(p["title"] for p in d["panels"]).lower()
    for needle in ("events and batches in", "lag", "decode errors", "lost", "close delay",
                   "detection latency", "flush latency", "backlog", "alert deliveries"):
        assert needle in titles


def test_provisioning_files():
    prov = load_provisioning()
    (prom,) = prov["datasources/prometheus.yaml"]["datasources"]
    assert prom["uid"] == PROM_UID and prom["type"] == PROM_TYPE and prom["url"].startswith("${")
    ds = prov["datasources/clickhouse.yaml"]
    assert ds["apiVersion"] == 1
    d = ds["datasources"][0]
    assert d["uid"] == DS_UID and d["type"] == DS_TYPE and d["name"]
    assert "password" in d["secureJsonData"] and "password" not in d["jsonData"]
    assert d["secureJsonData"]["password"].startswith("${")
    provider = prov["dashboards/perftracker.yaml"]["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    cps = prov["alerting/contact-points.yaml"]["contactPoints"]
    assert cps[0]["receivers"][0]["type"] == "webhook" and cps[0]["receivers"][0]["settings"]["url"]
    assert prov["alerting/policies.yaml"]["policies"][0]["receiver"] == cps[0]["name"]


def test_alert_rules_are_well_formed():
    groups = load_provisioning()["alerting/rules.yaml"]["groups"]
    for g in groups:
        assert g["name"] and g["folder"] and g["interval"]
        for r in g["rules"]:
            refs = {q["refId"] for q in r["data"]}
            assert r["condition"] in refs and r["uid"] and r["title"] and r["for"]
            for q in r["data"]:
                assert q["datasourceUid"] in (DS_UID, "__expr__")
                assert q["model"]["refId"] == q["refId"]
                if q["datasourceUid"] == "__expr__":
                    assert q["model"]["expression"] in refs
            text = str(r)
            assert not re.search(r"(?<!\$)\$(?!\$|\{PERFTRACKER_)\w", text.replace("$$", "")), \
                "a literal $ must be written $$ in provisioning files"


def test_no_grafana_rule_pages_an_incident():
    """Incidents page through the sink (Alertmanager, or its Slack/PagerDuty): a Grafana rule on
    the incidents or anomalies table would page the same incident a second time."""
    groups = load_provisioning()["alerting/rules.yaml"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules and "pt-incident-costly" not in {r["uid"] for r in rules}
    for r in rules:
        sql = " ".join(q["model"].get("rawSql", "") for q in r["data"]).lower()
        assert not re.search(r"\b(incidents|anomalies)\b", sql), r["uid"]
