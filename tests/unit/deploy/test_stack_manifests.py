"""deploy/compose and deploy/k8s parse, hang together, run what the Dockerfile builds and
only use settings that exist.

No Docker or Kubernetes here: these are the checks `docker compose config` and
`kubectl apply -k --dry-run` (and an operator's first day) would make. Schemas:
test_compose_schema.py and test_k8s_schema.py; the image: test_dockerfile.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from .manifests import (
    COMPOSE,
    COMPOSE_DIR,
    GRAFANA,
    IMAGE,
    K8S,
    KNOWN_ENV,
    PERFTRACKER_SERVICES,
    ROOT,
    SECRET_ENV,
    SECRET_NAME,
    compose,
    compose_env,
    container_env,
    containers,
    filled_env,
    image_tag_is_exact,
    interpolate,
    k8s_object,
    k8s_objects,
    kustomization,
    load_settings,
    pod_specs,
    secret_keys,
)

# PERFTRACKER_* variables read by something other than the settings loader's sections.
NOT_SETTINGS = {"PERFTRACKER_CONFIG", "PERFTRACKER_GRAFANA_TOKEN", "PERFTRACKER_GRAFANA_WEBHOOK_URL",
                "PERFTRACKER_RUNBOOK_URL"}
CONFIG_PATH = "/etc/perftracker/perftracker.yaml"


def _pt_env_names(env: dict | list) -> set[str]:
    names = {e["name"] for e in env} if isinstance(env, list) else set(env)
    return {n.removesuffix("_FILE") for n in names if n.startswith("PERFTRACKER_")} - NOT_SETTINGS


# -- compose ---------------------------------------------------------------------
def test_compose_parses_and_services_are_complete():
    doc = compose()
    services = doc["services"]
    assert {"kafka", "clickhouse", "grafana", "worker", "sink"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image"), name
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE_DIR / src).resolve().exists(), (name, src)
            else:
                assert src in doc["volumes"], (name, src)
        for ref in svc.get("configs", []):
            assert ref["source"] in doc["configs"], (name, ref)
        assert _pt_env_names(svc.get("environment", {})) <= KNOWN_ENV, name
    assert set(services["sink"]["secrets"]) <= set(doc["secrets"])
    for cfg in doc["configs"].values():
        assert (COMPOSE_DIR / cfg["file"]).exists(), cfg


def test_compose_holds_no_secret_values():
    doc = compose()
    for name, svc in doc["services"].items():
        for key, value in compose_env(svc).items():
            if key in SECRET_ENV or SECRET_NAME.search(key):
                assert value.startswith("${") or key.endswith("_FILE"), (name, key)


def test_compose_builds_the_image_it_runs():
    for name in PERFTRACKER_SERVICES:
        svc = compose()["services"][name]
        assert svc["image"] == IMAGE, name
        build = svc["build"]
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def test_compose_config_file_loads_with_the_config_loader(tmp_path):
    doc = interpolate(compose(), filled_env())
    mounts = {c["source"]: c["target"] for name in PERFTRACKER_SERVICES
              for c in doc["services"][name]["configs"]}
    assert mounts == {"perftracker": CONFIG_PATH}
    config_file = COMPOSE_DIR / doc["configs"]["perftracker"]["file"]
    secrets = {f"/run/secrets/{name}": tmp_path / name for name in doc["secrets"]}
    for path in secrets.values():  # each a value of its kind (URL settings are checked at load)
        path.write_text("https://hooks.slack.com/services/T0/B0/x" if "slack" in path.name
                        else "clickhouse://perftracker:pw@clickhouse:8123/perftracker")
    for name in PERFTRACKER_SERVICES:
        env = compose_env(doc["services"][name])
        assert env["PERFTRACKER_CONFIG"] == CONFIG_PATH
        env = {k: str(secrets.get(v, v)) for k, v in env.items()}
        settings = load_settings(config_file, env)
        assert settings.kafka.profile == "kafka" and settings.kafka.bootstrap_servers == "kafka:9092"
        if name == "sink":
            assert settings.store.url.reveal().startswith("clickhouse://")


# -- kubernetes ------------------------------------------------------------------
def test_k8s_objects_are_well_formed():
    for folder in (K8S, GRAFANA):
        kust = kustomization(folder)
        for res in kust.get("resources", []):
            target = folder / res
            assert target.is_file() or (target / "kustomization.yaml").is_file(), res
        for gen in kust.get("configMapGenerator", []):
            for rel in gen.get("files", []) + gen.get("envs", []):
                assert (folder / rel).is_file(), (folder, rel)
    listed = {r for r in kustomization(K8S)["resources"] if r.endswith(".yaml")}
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secrets.example.yaml"}
    assert listed == on_disk, "every manifest in deploy/k8s is applied (or is an example)"
    labels: list[dict] = []
    objects = k8s_objects()
    for fname, d in objects:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), fname
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "StatefulSet"):
            sel = spec["selector"]["matchLabels"]
            tmpl = spec["template"]["metadata"]["labels"]
            assert sel.items() <= tmpl.items(), fname
            labels.append(tmpl)
    for fname, d in objects:
        if d["kind"] == "Service":
            assert any(d["spec"]["selector"].items() <= lab.items() for lab in labels), fname


def test_k8s_references_resolve():
    """Every ConfigMap, Secret key, PVC and named port a pod uses exists."""
    objects = k8s_objects()
    config_maps = {d["metadata"]["name"]: d["data"] for _, d in objects if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for _, d in objects if d["kind"] == "PersistentVolumeClaim"}
    for name, spec in pod_specs():
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in config_maps, (name, vol)
            if "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in claims, (name, vol)
        for c in containers(spec):
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])} | _claim_templates(name), (name, c["name"])
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["key"] in config_maps[ref["configMapKeyRef"]["name"]], e
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["name"] == "perftracker-secrets", e
                    assert ref["secretKeyRef"]["key"] in secret_keys(), (name, e["name"])


def _claim_templates(workload: str) -> set[str]:
    d = next(d for _, d in k8s_objects()
             if d["metadata"]["name"] == workload and d["kind"] in ("Deployment", "StatefulSet"))
    return {t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}


def test_k8s_env_uses_known_settings_and_secrets_by_reference():
    for name, spec in pod_specs():
        for c in containers(spec):
            env = c.get("env", [])
            assert _pt_env_names(env) <= KNOWN_ENV, name
            assert not c.get("envFrom"), "settings come from the mounted config file"
            for e in env:
                if e["name"] in SECRET_ENV or SECRET_NAME.search(e["name"]):
                    assert "secretKeyRef" in e["valueFrom"], (name, e["name"])


def _workload(name: str) -> dict:
    return next(spec for n, spec in pod_specs() if n == name)


def test_k8s_config_map_loads_with_the_config_loader(tmp_path):
    data = k8s_object("ConfigMap", "perftracker-config")["data"]
    for name in ("perftracker-worker", "perftracker-sink"):
        spec = _workload(name)
        (c,) = spec["containers"]
        assert c["image"] == IMAGE
        env = container_env(c, secret_value="clickhouse://perftracker:pw@clickhouse:8123/perftracker",
                            by_name={"PERFTRACKER_ALERTS_WEBHOOK_URL": "https://hooks.example.com/pt",
                                     "PERFTRACKER_ALERTS_SLACK_WEBHOOK_URL": "https://hooks.slack.com/x"})
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        vol = next(v for v in spec["volumes"] if v["name"] == "config")
        assert vol["configMap"]["name"] == "perftracker-config"
        assert env["PERFTRACKER_CONFIG"] == f"{mount['mountPath']}/perftracker.yaml"
        path = tmp_path / "perftracker.yaml"
        path.write_text(data["perftracker.yaml"])
        settings = load_settings(path, env)
        assert settings.kafka.profile == "kafka" and settings.kafka.bootstrap_servers == "kafka:9092"
        assert str(settings.data_dir) in {m["mountPath"] for m in c["volumeMounts"]}


def test_k8s_pods_run_unprivileged():
    for name, spec in pod_specs():
        assert spec.get("automountServiceAccountToken") is False, name
        if name == "clickhouse":
            continue  # its entrypoint starts as root and drops to the clickhouse user
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        for c in containers(spec):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], (name, c["name"])


# -- both ------------------------------------------------------------------------
def _all_images() -> list[tuple[str, str]]:
    out = [(f"compose:{n}", s["image"]) for n, s in compose()["services"].items()]
    out += [(f"k8s:{n}/{c['name']}", c["image"]) for n, spec in pod_specs() for c in containers(spec)]
    return out


def test_every_image_is_pinned():
    for where, image in _all_images():
        assert "${" not in image and image_tag_is_exact(image), (where, image)
        if "perftracker" in image.split(":")[0]:
            assert image == IMAGE, (where, image)
    assert not image_tag_is_exact("apache/kafka:latest") and not image_tag_is_exact("clickhouse/clickhouse-server:24.8")
    assert image_tag_is_exact("prom/prometheus:v2.54.1") and not image_tag_is_exact("prom/prometheus:v2")


def test_every_container_has_requests_and_limits():
    for name, svc in compose()["services"].items():
        res = svc["deploy"]["resources"]
        assert {"cpus", "memory"} <= set(res["limits"]) and {"cpus", "memory"} <= set(res["reservations"]), name
    for name, spec in pod_specs():
        for c in containers(spec):
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"]), \
                (name, c["name"])


def _probe_url(command: list[str]) -> str:
    (url,) = re.findall(r"(?:urlopen|Request)\('([^']+)'", " ".join(command))  # Request: with a token
    return url


def _probe_ports(compose_cfg: Path, k8s_cfg_text: str, tmp_path: Path) -> dict[str, int]:
    path = tmp_path / "k8s.yaml"
    path.write_text(k8s_cfg_text)
    out = {}
    for where, cfg in (("compose", compose_cfg), ("k8s", path)):
        settings = load_settings(cfg, {})
        out[f"{where}:worker"] = settings.streams.web_port
        out[f"{where}:sink"] = settings.store.query_port
    return out


def test_worker_and_sink_are_probed_on_their_configured_health_endpoints(tmp_path):
    ports = _probe_ports(COMPOSE_DIR / "perftracker.yaml",
                        k8s_object("ConfigMap", "perftracker-config")["data"]["perftracker.yaml"], tmp_path)
    paths = {"worker": "/perftracker/stats/", "sink": "/health"}
    for role in PERFTRACKER_SERVICES:
        assert ports[f"compose:{role}"] > 0 and ports[f"k8s:{role}"] > 0, "a fixed port, not 0 (any free port)"
        url = urlparse(_probe_url(compose()["services"][role]["healthcheck"]["test"]))
        assert (url.hostname, url.port, url.path) == ("127.0.0.1", ports[f"compose:{role}"], paths[role])
        (c,) = _workload(f"perftracker-{role}")["containers"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            url = urlparse(_probe_url(c[probe]["exec"]["command"]))
            assert (url.hostname, url.port, url.path) == ("127.0.0.1", ports[f"k8s:{role}"], paths[role]), probe


def test_kafka_keeps_its_data_on_the_volume():
    svc = compose()["services"]["kafka"]
    log_dirs = compose_env(svc)["KAFKA_LOG_DIRS"]
    volume, mount = svc["volumes"][0].split(":")
    assert volume in compose()["volumes"] and log_dirs.startswith(mount + "/")
    (c,) = _workload("kafka")["containers"]
    log_dirs = container_env(c)["KAFKA_LOG_DIRS"]
    (mount,) = (m for m in c["volumeMounts"] if m["name"] in _claim_templates("kafka"))
    assert log_dirs.startswith(mount["mountPath"] + "/")


def _external_listener(advertised: str) -> str:
    (addr,) = (a for a in advertised.split(",") if a.startswith("EXTERNAL://"))
    return addr.removeprefix("EXTERNAL://")


def test_compose_kafka_advertises_an_address_training_hosts_can_reach():
    svc = compose()["services"]["kafka"]
    raw = _external_listener(compose_env(svc)["KAFKA_ADVERTISED_LISTENERS"])
    assert raw.startswith("${KAFKA_EXTERNAL_HOST:?"), "required, with no localhost default"
    resolved = interpolate(compose(), filled_env())["services"]["kafka"]
    addr = _external_listener(compose_env(resolved)["KAFKA_ADVERTISED_LISTENERS"])
    host, port = addr.rsplit(":", 1)
    assert host == "perftracker.example.internal"
    assert f"{port}:9094" in resolved["ports"]
    assert "localhost" not in compose_env(svc)["KAFKA_ADVERTISED_LISTENERS"]


def test_k8s_kafka_has_an_external_listener_advertised_from_config():
    spec = _workload("kafka")
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert _external_listener(env["KAFKA_ADVERTISED_LISTENERS"]["value"]) == "$(EXTERNAL_HOST):$(EXTERNAL_PORT)"
    names = [e["name"] for e in c["env"]]
    assert names.index("EXTERNAL_HOST") < names.index("KAFKA_ADVERTISED_LISTENERS"), "$(VAR) needs it first"
    external = k8s_object("ConfigMap", "kafka-external")["data"]
    for var, key in (("EXTERNAL_HOST", "ADVERTISED_HOST"), ("EXTERNAL_PORT", "ADVERTISED_PORT")):
        assert env[var]["valueFrom"]["configMapKeyRef"] == {"name": "kafka-external", "key": key}
    svc = k8s_object("Service", "kafka-external")
    assert svc["spec"]["type"] in ("NodePort", "LoadBalancer")
    (port,) = svc["spec"]["ports"]
    assert str(port["nodePort"]) == external["ADVERTISED_PORT"]
    assert port["targetPort"] in ("external", 9094)
    assert any(p["name"] == "external" and p["containerPort"] == 9094 for p in c["ports"])
    (check,) = spec["initContainers"]
    assert check["env"] == [env["EXTERNAL_HOST"]]
    assert 'test -n "$EXTERNAL_HOST"' in " ".join(check["command"])


def test_k8s_kafka_advertises_its_internal_listener_by_the_full_service_name():
    """Training pods in other namespaces bootstrap at the internal listener and then connect to
    the name Kafka advertises: a short `kafka` resolves only inside the stack's namespace."""
    (c,) = _workload("kafka")["containers"]
    advertised = {e["name"]: e for e in c["env"]}["KAFKA_ADVERTISED_LISTENERS"]["value"]
    (internal,) = (a for a in advertised.split(",") if a.startswith("INTERNAL://"))
    namespace = kustomization(K8S)["namespace"]
    assert internal == f"INTERNAL://kafka.{namespace}.svc.cluster.local:9092"
    svc = k8s_object("Service", "kafka")
    assert [p["port"] for p in svc["spec"]["ports"]] == [9092]


# -- grafana ---------------------------------------------------------------------
def _provisioning_variables() -> set[str]:
    lines = [line for p in (GRAFANA / "provisioning").rglob("*.yaml") for line in p.read_text().splitlines()
             if not line.lstrip().startswith("#")]
    return set(re.findall(r"(?<!\$)\$\{(\w+)\}", "\n".join(lines)))


def _dashboard_path() -> str:
    import yaml

    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/perftracker.yaml").read_text())
    return provider["providers"][0]["options"]["path"]


def test_compose_grafana_is_persistent_and_provisioned_from_files():
    svc = compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2][::-1] for v in svc["volumes"])
    assert mounts["/var/lib/grafana"] in compose()["volumes"]
    assert (COMPOSE_DIR / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
    assert (COMPOSE_DIR / mounts[_dashboard_path()]).resolve() == GRAFANA / "dashboards"
    env = compose_env(svc)
    assert _provisioning_variables() <= set(env)
    assert env["PERFTRACKER_GRAFANA_WEBHOOK_URL"].startswith("${PERFTRACKER_GRAFANA_WEBHOOK_URL:?")


def test_k8s_grafana_is_persistent_and_provisioned_from_every_file():
    spec = _workload("grafana")
    (c,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    by_path = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    assert "persistentVolumeClaim" in by_path["/var/lib/grafana"]
    expected = {f"/etc/grafana/provisioning/{d.name}": sorted(p.name for p in d.glob("*.yaml"))
                for d in (GRAFANA / "provisioning").iterdir() if d.is_dir()}
    expected[_dashboard_path()] = sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json"))
    for path, files in expected.items():
        cm = k8s_object("ConfigMap", by_path[path]["configMap"]["name"])
        assert sorted(cm["data"]) == files, path
    env = {e["name"]: e for e in c["env"]}
    assert _provisioning_variables() <= set(env)
    assert env["PERFTRACKER_GRAFANA_WEBHOOK_URL"]["valueFrom"]["secretKeyRef"]["key"] == "grafana-webhook-url"


@pytest.mark.parametrize("path", [COMPOSE, *sorted(K8S.glob("*.yaml"))], ids=lambda p: p.name)
def test_no_localhost_reaches_outside(path):
    """Addresses other hosts use never default to localhost (probes inside a container may)."""
    for line in path.read_text().splitlines():
        if "localhost" in line:
            assert re.search(r"healthcheck|--bootstrap-server localhost|wget -qO- http://localhost|"
                             r"QUORUM_VOTERS.*1@localhost", line), line
