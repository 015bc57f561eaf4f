"""Dashboards and provisioning files parse and carry what Grafana requires."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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
        assert json.loads(text) == files[name], f"run python -m perftracker_ml.grafana.build ({name})"


def datasource_variables(d: dict) -> dict[str, dict]:
    """``{variable name: variable}`` for the dashboard's datasource variables."""
    return {v["name"]: v for v in d["templating"]["list"] if v["type"] == "datasource"}


def resolves(d: dict, ref: dict) -> bool:
    """A datasource reference is a ``${variable}`` of the dashboard's, of the same plugin, that
    starts at the provisioned datasource of that plugin (no uid is hard-coded)."""
    m = re.fullmatch(r"\$\{(\w+)\}", ref["uid"])
    var = datasource_variables(d).get(m.group(1)) if m else None
    return bool(var) and var["query"] == ref["type"] and DATASOURCES.get(var["current"]["value"]) == ref["type"]


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
            assert resolves(d, p["datasource"]), (name, p["title"], p["datasource"])
        for p, t in panel_queries(d):
            assert t["refId"] and t["datasource"] == p["datasource"]
            if t["datasource"]["type"] == DS_TYPE:
                assert t["rawSql"].strip() and t["editorType"] == "sql"
            else:
                assert t["expr"].strip()
        for a in d["annotations"]["list"]:
            assert resolves(d, a["datasource"]) and a["target"]["datasource"] == a["datasource"], name
    assert uids == {"perftracker-fleet", "perftracker-job", "perftracker-health"}  # links point at them


def test_import_asks_for_every_datasource_the_dashboard_uses():
    """``__inputs``: Grafana's import form asks for one datasource per plugin used; ``__requires``
    names the plugins and panels."""
    for name, d in load_dashboards().items():
        used = {v["query"] for v in datasource_variables(d).values()}
        assert {i["pluginId"] for i in d["__inputs"] if i["type"] == "datasource"} == used, name
        required = {(r["type"], r["id"]) for r in d["__requires"]}
        assert {("datasource", plugin) for plugin in used} <= required, name
        assert {("panel", p["type"]) for p in d["panels"]} <= required, name


def test_incidents_are_annotations_on_every_time_series():
    """Each dashboard has an incident annotation (the incidents table, advice left out), enabled,
    with no panel filter: Grafana draws it on every time-series and state-timeline panel."""
    for name, d in load_dashboards().items():
        (anno,) = [a for a in d["annotations"]["list"] if "incidents" in a["target"].get("rawSql", "")]
        assert anno["enable"] and "filter" not in anno, name
        sql = anno["target"]["rawSql"]
        assert "FROM incidents FINAL" in sql and "kind != 'advice'" in sql
        for column in ("AS time", "AS timeEnd", "AS text", "AS tags", "summary", "ranks", "cause"):
            assert column in sql, (name, column)
        assert ("${job:sqlstring}" in sql) == (name == "job.json")


def test_the_job_link_alerts_use_is_stable():
    """Alerts and the fleet view link ``/d/perftracker-job/perftracker-job?var-job=<job>``."""
    fleet = load_dashboards()["fleet.json"]
    jobs = next(p for p in fleet["panels"] if p["title"] == "Jobs")
    urls = [v["url"] for o in jobs["fieldConfig"]["overrides"] for prop in o["properties"]
            if prop["id"] == "links" for v in prop["value"]]
    assert urls and all(u.startswith("/d/perftracker-job/perftracker-job?var-job=${__value.text}") for u in urls)
    job = load_dashboards()["job.json"]
    assert job["uid"] == "perftracker-job" and "job" in {v["name"] for v in job["templating"]["list"]}


def test_every_variable_a_query_uses_is_defined():
    for name, d in load_dashboards().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        texts = [t.get("rawSql") or t["expr"] for _, t in panel_queries(d)] + \
            [v["query"] for v in d["templating"]["list"]] + \
            [a["target"]["rawSql"] for a in d["annotations"]["list"]] + \
            [p["datasource"]["uid"] for p in d["panels"]]
        for sql in texts:
            used = {m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(?!__)(\w+)", sql)}
            assert used <= defined, (name, used - defined)


def test_job_view_has_the_panels_on_call_needs():
    d = load_dashboards()["job.json"]
    titles = " | ".join(p["title"] for p in d["panels"]).lower()
    for needle in ("step time", "p50-p99 band", "k slowest ranks", "culprits", "rank x function",
                   "late arrivals", "sm clock", "temperature", "throttling", "incidents and evidence"):
        assert needle in titles
    names = {v["name"] for v in d["templating"]["list"]}
    assert names == {"datasource", "job", "host", "rank", "k"}
    (k,) = [v for v in d["templating"]["list"] if v["name"] == "k"]
    assert k["current"]["value"] == "5" and k["type"] == "custom"
    types = {p["title"]: p["type"] for p in d["panels"]}
    assert "state-timeline" in types.values()


def test_all_hosts_and_ranks_turn_the_filter_off():
    """At "All", host and rank insert their custom all values ('*', -1) as they are, and every
    filter on them lets that value through: no query carries a list of 10,000 ranks."""
    d = load_dashboards()["job.json"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["host"]["allValue"] == "'*'" and variables["rank"]["allValue"] == "-1"
    texts = [t["rawSql"] for _, t in panel_queries(d)] + [v["query"] for v in variables.values()]
    for sql in texts:
        assert sql.count("host IN (${host:sqlstring})") == sql.count("'*' IN (${host:sqlstring}) OR host IN"), sql
        assert sql.count("rank IN (${rank:csv})") == sql.count("-1 IN (${rank:csv}) OR rank IN"), sql


def test_rank_by_function_views_are_coloured():
    """The rank x function tables colour every value cell (thresholds on the slowdown, a
    gradient on late arrivals), never an uncoloured matrix."""
    d = load_dashboards()["job.json"]
    for needle in ("rank x function", "late arrivals"):
        (p,) = [p for p in d["panels"] if needle in p["title"].lower()]
        defaults = p["fieldConfig"]["defaults"]
        assert defaults["custom"]["cellOptions"]["type"] == "color-background", p["title"]
        assert defaults["color"]["mode"] in ("thresholds", "continuous-GrYlRd")
        if defaults["color"]["mode"] == "thresholds":
            steps = defaults["thresholds"]["steps"]
            assert steps[0]["value"] is None and [s["value"] for s in steps[1:]] == sorted(s["value"] for s in steps[1:])
        assert p["transformations"][0]["options"]["rowField"] == "rank_name"


# Grafana's dashboard JSON model (schemaVersion 39), pinned in this repository: see its $comment
# for where it comes from and where it differs from the Foundation SDK's generated schema.
SCHEMA = Path(__file__).parent / "schema" / "grafana-dashboard.schema.json"


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMA),
                           *map(str, files)], capture_output=True, text=True, timeout=120)


def test_dashboards_validate_against_the_pinned_grafana_schema(tmp_path: Path):
    files = sorted(build.HERE.glob("*.json"))
    assert [f.name for f in files] == sorted(build.DASHBOARDS)
    res = check_jsonschema(*files)
    assert res.returncode == 0, res.stdout + res.stderr
    # the schema has teeth: a panel wider than the grid, a variable with a bad name, an unknown key
    job = json.loads((build.HERE / "job.json").read_text())
    job["panels"][0]["gridPos"]["w"] = 30
    job["templating"]["list"][0]["name"] = "bad name"
    job["panels"][1]["fieldconfig"] = {}
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps(job))
    res = check_jsonschema(bad)
    assert res.returncode == 1 and "gridPos" in res.stdout and "bad name" in res.stdout, res.stdout


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
    assert exprs and all(p["datasource"]["type"] == PROM_TYPE for p in d["panels"])
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
