"""deploy/compose and deploy/k8s parse, hang together and only use settings that exist.

No Docker or Kubernetes here: these are structural checks (what a linter would
catch before `docker compose up` / `kubectl apply -k` does).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from perftracker.schemas.settings_loader import describe_settings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yaml"
K8S = ROOT / "deploy" / "k8s"
KNOWN_ENV = {row[0] for row in describe_settings()}
SECRET_ENV = {row[0] for row in describe_settings() if row[1] == "Secret"}


def _pt_env_names(env: dict | list) -> set[str]:
    names = {e["name"] for e in env} if isinstance(env, list) else set(env)
    return {n.removesuffix("_FILE") for n in names if n.startswith("PERFTRACKER_")} - {
        "PERFTRACKER_GRAFANA_TOKEN", "PERFTRACKER_GRAFANA_WEBHOOK_URL", "PERFTRACKER_RUNBOOK_URL"}


def test_compose_parses_and_services_are_complete():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert {"kafka", "clickhouse", "grafana", "worker", "sink"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image"), name
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).resolve().exists(), (name, src)
            else:
                assert src in doc["volumes"], (name, src)
        assert _pt_env_names(svc.get("environment", {})) <= KNOWN_ENV, name
    assert set(services["sink"]["secrets"]) <= set(doc["secrets"])


def test_compose_holds_no_secret_values():
    doc = yaml.safe_load(COMPOSE.read_text())
    for name, svc in doc["services"].items():
        for key, value in svc.get("environment", {}).items():
            if key in SECRET_ENV or re.search("PASSWORD|SECRET|TOKEN|ROUTING_KEY", key):
                assert str(value).startswith("${") or key.endswith("_FILE"), (name, key)


def _k8s_docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d:
                out.append((path.name, d))
    return out


def test_k8s_objects_are_well_formed():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (K8S / res).exists(), res
    labels: list[dict] = []
    for fname, d in _k8s_docs():
        if d["kind"] == "Kustomization":
            continue
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), fname
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "StatefulSet"):
            sel = spec["selector"]["matchLabels"]
            tmpl = spec["template"]["metadata"]["labels"]
            assert sel.items() <= tmpl.items(), fname
            labels.append(tmpl)
    for fname, d in _k8s_docs():
        if d["kind"] == "Service":
            assert any(d["spec"]["selector"].items() <= lab.items() for lab in labels), fname


def test_k8s_env_uses_known_settings_and_secrets_by_reference():
    secret_keys = set(yaml.safe_load((K8S / "secrets.example.yaml").read_text())["stringData"])
    config = next(d for _, d in _k8s_docs() if d["kind"] == "ConfigMap")
    assert set(config["data"]) <= KNOWN_ENV
    for fname, d in _k8s_docs():
        if d["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = c.get("env", [])
            assert _pt_env_names(env) <= KNOWN_ENV, fname
            for e in env:
                if e["name"] in SECRET_ENV or re.search("PASSWORD|SECRET|TOKEN|ROUTING_KEY", e["name"]):
                    ref = e["valueFrom"]["secretKeyRef"]
                    assert ref["key"] in secret_keys, (fname, e["name"])
