"""No configured secret ever shows: every Secret setting gets a distinct value, the commands that
print run for real, and every captured output, log and error text is searched for each value.

Three runs, as an operator would meet them:

* the embedded stack with every secret configured (a schema registry that checks its password,
  a bearer token on every HTTP endpoint, alert channels that cannot be reached): `config`,
  `up`, `status` (with and without --json), a synthetic job diagnosed through the query API,
  an unknown job (an error path), `down`; the stack's logs and state files;
* Kafka that cannot be reached with TLS + SASL (SCRAM, then OAUTHBEARER against a token
  endpoint that is down): the worker's, the sink's and a collector's error texts;
* a ClickHouse store URL with a password that cannot be reached: `diagnose` and the sink.

tansu has no TLS or SASL, so the stack itself runs PLAINTEXT with the Kafka secrets configured
(they reach every client configuration); the TLS/SASL clients meet an unreachable broker.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import get_type_hints

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.deploy.workloads.kineto import TraceJob, write_job
from perftracker_ml.schemas.settings import Secret, Settings
from perftracker_ml.schemas.settings_loader import env_name

from ...registry_fake import USER, FakeRegistry
from ...tls import make_tls_files
from .conftest import Stack, stack_env

pytestmark = pytest.mark.integration


def secret_settings() -> list[tuple[str, str]]:
    """(section, name) of every Secret setting declared in schemas/settings.py."""
    found = []

    def walk(cls: type, section: str) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            if isinstance(hints[f.name], type) and is_dataclass(hints[f.name]):
                walk(hints[f.name], f.name)
            elif hints[f.name] is Secret:
                found.append((section, f.name))

    walk(Settings, "")
    return found


def value(name: str) -> str:
    return f"pt{name.replace('_', '')[:12]}{uuid.uuid4().hex[:10]}"


class Transcript:
    """Every text a run produced, with where it came from."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def add(self, where: str, text: str | bytes) -> str:
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        self.texts.append((where, text))
        return text

    def run(self, stack: Stack, *args: str, env: dict[str, str] | None = None, timeout: float = 180,
            expect: int | None = 0) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "perftracker_ml.deploy.cli", *args], env=env or stack.env,
                              capture_output=True, text=True, timeout=timeout)
        self.add(f"perftracker {' '.join(args)} (stdout)", proc.stdout)
        self.add(f"perftracker {' '.join(args)} (stderr)", proc.stderr)
        if expect is not None:
            assert proc.returncode == expect, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def add_files(self, root: Path) -> None:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "chdb" not in path.relative_to(root).parts:
                self.add(str(path.relative_to(root)), path.read_bytes())

    def assert_none_of(self, secrets: dict[str, str]) -> None:
        assert len(self.texts) > 5
        leaks = [f"{name} in {where}" for where, text in self.texts for name, v in secrets.items() if v in text]
        assert leaks == [], "secret values shown:\n" + "\n".join(leaks)


def test_every_setting_of_type_secret_is_covered():
    assert {(s, n) for s, n in secret_settings()} == {
        ("", "http_token"), ("kafka", "sasl_password"), ("kafka", "sasl_oauthbearer_client_secret"),
        ("kafka", "ssl_key_password"), ("kafka", "librdkafka_secret"), ("kafka", "schema_registry_password"),
        ("store", "url"), ("store", "password"), ("alerts", "webhook_secret"), ("alerts", "slack_webhook_url"),
        ("alerts", "pagerduty_routing_key"), ("alerts", "alertmanager_password"),
        ("alerts", "alertmanager_bearer_token")}


def test_the_stack_never_shows_a_secret(tmp_path, registry):
    secrets = {name: value(name) for _, name in secret_settings()}
    dead = free_port()
    secrets["slack_webhook_url"] = f"http://127.0.0.1:{dead}/services/{secrets['slack_webhook_url']}"
    secrets["librdkafka_secret"] = value("keystore")
    FakeRegistry.password = secrets["schema_registry_password"]
    env = {env_name(section, name): secrets[name] for section, name in secret_settings() if name != "url"}
    env.update({"PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET": f"ssl.keystore.password={secrets['librdkafka_secret']}",
                "PERFTRACKER_KAFKA_SCHEMA_REGISTRY_URL": registry,
                "PERFTRACKER_KAFKA_SCHEMA_REGISTRY_USERNAME": USER,
                "PERFTRACKER_ALERTS_WEBHOOK_URL": f"http://127.0.0.1:{dead}/hook",
                "PERFTRACKER_ALERTS_PAGERDUTY_URL": f"http://127.0.0.1:{dead}/v2/enqueue",
                "PERFTRACKER_ALERTS_MAX_ATTEMPTS": "2", "PERFTRACKER_ALERTS_RETRY_BASE_S": "0.1"})
    del secrets["url"]  # a chDB store here: store.url is covered by the store test below
    # Alertmanager takes a bearer token or basic auth, not both: the token goes through a config of its own
    token_env = env_name("alerts", "alertmanager_bearer_token")
    bearer = {token_env: env.pop(token_env)}
    env[env_name("alerts", "alertmanager_username")] = "svc-alerts"
    stack = Stack(tmp_path, stack_env(tmp_path, **env))
    out = Transcript()
    out.run(stack, "config")
    basic = {env_name("alerts", "alertmanager_password"), env_name("alerts", "alertmanager_username")}
    out.run(stack, "config", env={**{k: v for k, v in stack.env.items() if k not in basic}, **bearer})
    out.run(stack, "up")
    try:
        out.run(stack, "status")
        info = json.loads(out.run(stack, "status", "--json").stdout)
        assert info["running"] and all(w["stats"]["assigned"] for w in info["workers"])  # status sent the token
        port = info["workers"][0]["port"]
        stats = f"http://127.0.0.1:{port}/perftracker/stats/"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(stats, timeout=5)
        assert denied.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(info["sink"]["query_url"] + "/health", timeout=5)
        assert denied.value.code == 401
        job = f"job-{uuid.uuid4().hex[:6]}"
        synth = out.run(stack, "synth", "--job", job, "--ranks", "4", "--seconds", "20", "--slow-rank", "2",
                        "--timeout", "120")
        assert "rank" in synth.stdout and "2" in synth.stdout
        diagnosis = json.loads(out.run(stack, "diagnose", "--job", job, "--json").stdout)
        assert diagnosis and diagnosis[0]["ranks"] == [2]
        assert any(s.startswith("pt.findings-") for s in FakeRegistry.subjects)  # the workers framed with it
        out.run(stack, "diagnose", "--job", "no-such-job", expect=1)
        write_job(TraceJob(ranks=4, steps=4, layers=4, buckets=1, slow_rank=1, slowdown=1.6), tmp_path / "traces")
        kept = out.run(stack, "import-traces", str(tmp_path / "traces"), "--job", "imported")  # POST /store: token
        assert "stored in the stack's sink" in kept.stdout
        assert json.loads(out.run(stack, "diagnose", "--job", "imported", "--json").stdout)
    finally:
        out.run(stack, "down", expect=None)
    out.add_files(tmp_path)
    assert any(where.startswith("logs/worker-") for where, _ in out.texts)
    assert any(where == "logs/sink.log" for where, _ in out.texts)
    out.assert_none_of(secrets)


def test_failing_kafka_connections_never_show_a_secret(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    secrets = {"sasl_password": value("sasl"), "ssl_key_password": "key-pass-7Qx",
               "librdkafka_secret": value("keystore"), "client_secret": value("oidc")}
    base = stack_env(tmp_path, PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
                     PERFTRACKER_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
                     PERFTRACKER_KAFKA_SSL_CA_LOCATION=str(tls.ca),
                     PERFTRACKER_KAFKA_SSL_CERTIFICATE_LOCATION=str(tls.client_cert),
                     PERFTRACKER_KAFKA_SSL_KEY_LOCATION=str(tls.client_key),
                     PERFTRACKER_KAFKA_SSL_KEY_PASSWORD=secrets["ssl_key_password"],
                     PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET=f"ssl.keystore.password={secrets['librdkafka_secret']}")
    scram = {**base, "PERFTRACKER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "PERFTRACKER_KAFKA_SASL_USERNAME": "svc",
             "PERFTRACKER_KAFKA_SASL_PASSWORD": secrets["sasl_password"]}
    oauth = {**base, "PERFTRACKER_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
             "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}/token",
             "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "perftracker",
             "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": secrets["client_secret"]}
    stack = Stack(tmp_path, base)
    out = Transcript()
    for env in (scram, oauth):
        for command in ("worker", "sink"):
            proc = out.run(stack, command, env=env, timeout=90, expect=1)
            assert "cannot reach Kafka" in proc.stderr
        collector = subprocess.run(
            [sys.executable, "-c", "import time; from perftracker_ml.collectors import attach, detach; "
             "c = attach('job-x'); time.sleep(3); detach()"],
            env={**env, "PERFTRACKER_COLLECTOR_EXIT_FLUSH_S": "0.5", "PERFTRACKER_COLLECTOR_LOG_EVERY_S": "0"},
            capture_output=True, text=True, timeout=60)
        out.add("collector (stdout)", collector.stdout)
        out.add("collector (stderr)", collector.stderr)
    out.add_files(tmp_path)
    out.assert_none_of(secrets)


def test_a_failing_store_never_shows_its_password(tmp_path):
    password, url_password = value("chpw"), value("urlpw")
    env = stack_env(tmp_path, PERFTRACKER_STORE_URL=f"clickhouse://perftracker:{url_password}@127.0.0.1:"
                                                    f"{free_port()}/metrics",
                    PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}")
    stack = Stack(tmp_path, env)
    out = Transcript()
    proc = out.run(stack, "diagnose", "--job", "j", expect=1)
    assert "cannot reach ClickHouse at http://perftracker:***@127.0.0.1:" in proc.stderr
    out.run(stack, "diagnose", "--job", "j", expect=1,
            env={**env, "PERFTRACKER_STORE_PASSWORD": password})
    sink = subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", "sink"],
                            env={**env, "PERFTRACKER_STORE_PASSWORD": password},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(sink.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90  # its first attempt at the store: seconds, more on a loaded machine
    while sink.poll() is None and time.monotonic() < deadline and not any("store not ready" in x for x in lines):
        time.sleep(0.2)
    if sink.poll() is None:
        sink.send_signal(signal.SIGTERM)
    stdout = sink.stdout.read()
    sink.wait(timeout=30)
    reader.join(timeout=30)
    stderr = "".join(lines)
    out.add("sink (stdout)", stdout)
    out.add("sink (stderr)", stderr)
    assert "store not ready" in stderr
    out.assert_none_of({"store password": password, "url password": url_password,
                        "url": env["PERFTRACKER_STORE_URL"]})
