"""`grafana push` against a local HTTP server that records requests and plays a tiny Grafana."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
from perftracker_ml.grafana.dashboards import load_dashboards
from perftracker_ml.grafana.push import GrafanaPushError, push, read_token


class FakeGrafana:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict | None, dict[str, str]]] = []
        self.objects: dict[str, dict] = {}
        outer = self

        class H(BaseHTTPRequestHandler):
            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                url = urlparse(self.path)
                outer.calls.append((method, url.path, body, dict(self.headers)))
                status, reply = outer.route(method, url.path, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def route(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        if path == "/api/v1/provisioning/contact-points" and method == "GET":
            return 200, [v for k, v in self.objects.items() if k.startswith(path + "/")]
        if method == "GET":
            return (200, self.objects[path]) if path in self.objects else (404, {"message": "not found"})
        if path == "/api/dashboards/db":
            self.objects[f"/api/dashboards/uid/{body['dashboard']['uid']}"] = body
            return 200, {"status": "success", "uid": body["dashboard"]["uid"]}
        collection = {"/api/folders": "/api/folders/", "/api/datasources": "/api/datasources/uid/"}
        key = collection.get(path, path + "/") + body["uid"] if method == "POST" else path
        self.objects[key] = body
        return 200, {**body, "id": 1}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    g = FakeGrafana()
    yield g
    g.close()


VALUES = {"CLICKHOUSE_HOST": "ch", "CLICKHOUSE_PORT": "8123", "CLICKHOUSE_USER": "pt",
          "CLICKHOUSE_PASSWORD": "pw", "CLICKHOUSE_DB": "perftracker",
          "PERFTRACKER_GRAFANA_WEBHOOK_URL": "http://oncall/hook", "PROMETHEUS_URL": "http://prom:9090"}


def test_push_sends_the_expected_calls_and_is_idempotent(grafana):
    first = push(grafana.url, "tok3n", VALUES)
    calls = [(m, p) for m, p, _, _ in grafana.calls]
    assert ("POST", "/api/folders") in calls
    assert ("POST", "/api/datasources") in calls
    assert calls.count(("POST", "/api/dashboards/db")) == len(load_dashboards()) == 3
    assert ("POST", "/api/v1/provisioning/contact-points") in calls
    assert calls.count(("POST", "/api/v1/provisioning/alert-rules")) == 2
    assert all(h.get("Authorization") == "Bearer tok3n" for *_, h in grafana.calls)
    ds = grafana.objects["/api/datasources/uid/perftracker-clickhouse"]
    assert ds["jsonData"]["host"] == "ch" and ds["jsonData"]["port"] == 8123
    assert ds["secureJsonData"]["password"] == "pw"
    prom = grafana.objects["/api/datasources/uid/perftracker-prometheus"]
    assert prom["type"] == "prometheus" and prom["url"] == "http://prom:9090"
    rule = grafana.objects["/api/v1/provisioning/alert-rules/pt-job-silent"]
    assert rule["folderUID"] == "perftracker" and "{{ $labels.job }}" in rule["annotations"]["summary"]
    assert all(line.endswith(("created", "pushed")) for line in first)

    n = len(grafana.calls)
    second = push(grafana.url, "tok3n", VALUES)
    again = [(m, p) for m, p, _, _ in grafana.calls[n:]]
    assert not [c for c in again if c[0] == "POST" and c[1] != "/api/dashboards/db"]
    assert ("PUT", "/api/datasources/uid/perftracker-clickhouse") in again
    assert ("PUT", "/api/v1/provisioning/alert-rules/pt-job-silent") in again
    assert all(line.endswith(("updated", "pushed")) for line in second)
    dash = grafana.objects["/api/dashboards/uid/perftracker-job"]
    assert dash["overwrite"] is True and dash["folderUid"] == "perftracker"
    # the dashboard model only: the import envelope (__inputs, __requires) stays in the files
    assert "__inputs" in load_dashboards()["job.json"] and not any(k.startswith("__") for k in dash["dashboard"])
    assert dash["dashboard"]["templating"] == load_dashboards()["job.json"]["templating"]


def test_push_to_nowhere_is_a_clear_error_without_the_token():
    with pytest.raises(GrafanaPushError, match="cannot push") as exc:
        push("http://127.0.0.1:9", "s3cret-token", VALUES, timeout_s=1)
    assert "s3cret-token" not in str(exc.value)


def test_token_from_env_or_file(tmp_path: Path):
    assert read_token({"PERFTRACKER_GRAFANA_TOKEN": "a"}) == "a"
    f = tmp_path / "t"
    f.write_text("b\n")
    assert read_token({}, f) == "b"
    with pytest.raises(GrafanaPushError, match="PERFTRACKER_GRAFANA_TOKEN"):
        read_token({})
