"""perftracker's own monitoring as shipped: the pipeline's alert rules pass promtool (check and
unit tests), the Prometheus Operator copy of them is the same, and every manifest has the
workers' and the sink's metrics on and scraped (compose's prometheus service, the Kubernetes
pods' metrics ports and annotations, the PodMonitors with the sink's bearer token)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from perftracker_ml.schemas.http_auth import is_loopback

from ...system_binaries import require
from .manifests import (
    COMPOSE_DIR,
    GRAFANA,
    K8S,
    ROOT,
    compose,
    compose_env,
    filled_env,
    interpolate,
    k8s_object,
    load_settings,
    pod_specs,
    secret_keys,
)

RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "perftracker-rules.yaml"
MONITORING = K8S / "monitoring"


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess:
    return subprocess.run([require("promtool", "prometheus"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_rules_pass_promtool_check():
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rules_pass_their_unit_tests():
    proc = promtool("test", "rules", "perftracker-rules.test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_cover_the_pipeline_and_name_only_exported_metrics():
    from perftracker_ml.schemas.counters import Kind
    from perftracker_ml.sinks.alerts.worker import AlertCounters
    from perftracker_ml.sinks.service import SinkCounters
    from perftracker_ml.streams.context import StreamCounters

    exported = set()
    for cls in (StreamCounters, SinkCounters, AlertCounters):
        for c in cls.declared:
            base = f"perftracker_{cls.component}_{c.name}"
            exported |= {base + "_total"} if c.kind is Kind.COUNTER else {base, base + "_bucket"}
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {"PerftrackerConsumerLagHigh", "PerftrackerDetectionSlow", "PerftrackerSinkFlushFailing",
            "PerftrackerStoreUnreachable", "PerftrackerDeadLetters",
            "PerftrackerAlertDeliveryFailing"} <= names

    for r in rules:
        used = set(re.findall(r"\bperftracker_\w+", r["expr"]))
        assert used and used <= exported, (r["alert"], used - exported)
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]


def test_prometheus_operator_rule_carries_the_same_groups():
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


# -- compose -----------------------------------------------------------------------
def test_compose_runs_prometheus_scraping_the_worker_and_the_sink(tmp_path):
    doc = interpolate(compose(), filled_env())
    services = doc["services"]
    prom = services["prometheus"]
    assert "prometheus" in compose_env(services["grafana"])["PROMETHEUS_URL"]  # Grafana's datasource
    configs = {c["target"]: doc["configs"][c["source"]]["file"] for c in prom["configs"]}
    scrape = yaml.safe_load((COMPOSE_DIR / configs["/etc/prometheus/prometheus.yaml"]).read_text())
    rules = (COMPOSE_DIR / configs["/etc/prometheus/rules/perftracker-rules.yaml"]).resolve()
    assert rules == RULES
    settings = load_settings(COMPOSE_DIR / "perftracker.yaml", {})
    assert settings.streams.metrics_port > 0 and not is_loopback(settings.streams.metrics_host)
    assert not is_loopback(settings.store.query_host)
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    (worker,) = jobs["perftracker-worker"]["dns_sd_configs"]
    assert worker["names"] == ["worker"] and worker["port"] == settings.streams.metrics_port
    sink = jobs["perftracker-sink"]
    assert sink["static_configs"][0]["targets"] == [f"sink:{settings.store.query_port}"]
    token = sink["authorization"]["credentials_file"]
    assert token == "/run/secrets/http_token" and "http_token" in prom["secrets"]
    assert compose_env(services["sink"])["PERFTRACKER_HTTP_TOKEN_FILE"] == token
    # promtool checks the configuration as Prometheus will load it, paths made local
    (tmp_path / "token").write_text("t0ken\n")
    text = (COMPOSE_DIR / "prometheus.yaml").read_text()
    text = text.replace("/etc/prometheus/rules/*.yaml", str(RULES)).replace(token, str(tmp_path / "token"))
    (tmp_path / "prometheus.yaml").write_text(text)
    proc = promtool("check", "config", str(tmp_path / "prometheus.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_grafana_datasource_reads_the_prometheus_url():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "${PROMETHEUS_URL}"


# -- kubernetes --------------------------------------------------------------------
def _pod(name: str) -> tuple[dict, dict]:
    d = k8s_object("Deployment", name)
    return d["spec"]["template"]["metadata"], d["spec"]["template"]["spec"]


def test_k8s_workers_and_sink_expose_a_metrics_port_with_scrape_annotations(tmp_path):
    path = tmp_path / "perftracker.yaml"
    path.write_text(k8s_object("ConfigMap", "perftracker-config")["data"]["perftracker.yaml"])
    settings = load_settings(path, {})
    assert settings.streams.metrics_port > 0 and not is_loopback(settings.streams.metrics_host)
    assert not is_loopback(settings.store.query_host)
    expected = {"perftracker-worker": settings.streams.metrics_port,
                "perftracker-sink": settings.store.query_port}
    for name, port in expected.items():
        meta, spec = _pod(name)
        (c,) = spec["containers"]
        assert {"name": "metrics", "containerPort": port} in c["ports"], name
        assert meta["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                                       "prometheus.io/path": "/metrics"}, name
    _, spec = _pod("perftracker-sink")
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    ref = env["PERFTRACKER_HTTP_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "perftracker-secrets", "key": "http-token"} and "http-token" in secret_keys()


def test_k8s_pod_monitors_scrape_the_metrics_ports_the_sink_with_its_token():
    kust = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    objects = [d for res in kust["resources"] for d in yaml.safe_load_all((MONITORING / res).read_text()) if d]
    monitors = {d["metadata"]["name"]: d for d in objects if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"perftracker-worker", "perftracker-sink"}
    labels = {n: _pod(n)[0]["labels"] for n in monitors}
    for name, mon in monitors.items():
        assert mon["apiVersion"] == "monitoring.coreos.com/v1"
        assert mon["spec"]["selector"]["matchLabels"].items() <= labels[name].items()
        (endpoint,) = mon["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    (sink,) = monitors["perftracker-sink"]["spec"]["podMetricsEndpoints"]
    assert sink["authorization"] == {"type": "Bearer",
                                     "credentials": {"name": "perftracker-secrets", "key": "http-token"}}
    assert "authorization" not in monitors["perftracker-worker"]["spec"]["podMetricsEndpoints"][0]
    assert {n for n, _ in pod_specs()} >= set(monitors)
