"""The sink's query API over real HTTP: loopback by default, bearer token when configured."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import Secret
from perftracker_ml.sinks.api import QueryServer

TOKEN = "q-t0ken-81"


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest.fixture
def serve():
    started: list[QueryServer] = []

    def start(**kw) -> QueryServer:
        server = QueryServer(object(), 0, lambda: {"consumed": 3}, **kw).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_default_is_loopback_without_a_token(serve):
    api = serve()
    assert api.url.startswith("http://127.0.0.1:") and api._httpd.server_address[0] == "127.0.0.1"
    assert get(api.url + "/health")[:2] == (200, {"ok": True, "stats": {"consumed": 3}})


def test_with_a_token_every_request_needs_it(serve):
    api = serve(token=Secret(TOKEN))
    code, body, headers = get(api.url + "/health")
    assert code == 401 and "bearer token" in body["error"] and headers["WWW-Authenticate"] == "Bearer"
    assert get(api.url + "/health", {"Authorization": "Bearer wrong"})[0] == 401
    assert get(api.url + "/query/jobs", {"Authorization": f"Bearer {TOKEN}x"})[0] == 401
    assert get(api.url + "/health", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert TOKEN not in json.dumps(get(api.url + "/health")[1])


def test_beyond_loopback_refused_without_a_token_served_with_one(serve):
    with pytest.raises(ConfigError, match="store.query_host = 0.0.0.0"):
        QueryServer(object(), 0, host="0.0.0.0")  # type: ignore[arg-type]
    api = serve(host="0.0.0.0", token=Secret(TOKEN))
    assert api._httpd.server_address[0] == "0.0.0.0" and api.url.startswith("http://127.0.0.1:")
    assert get(api.url + "/health")[0] == 401
    assert get(api.url + "/health", {"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_the_cli_client_sends_the_token(serve, tmp_path):
    from dataclasses import replace

    from perftracker_ml.schemas.settings import Settings
    from perftracker_ml.sinks.client import _via_api
    from perftracker_ml.sinks.errors import NoStore

    api = serve(token=Secret(TOKEN))
    settings = replace(Settings(data_dir=tmp_path), http_token=Secret(TOKEN))
    with pytest.raises(NoStore, match="answered 401"):
        _via_api(api.url, "jobs", {}, Secret(""))
    with pytest.raises(Exception) as err:  # past the token: the stub store cannot answer
        _via_api(api.url, "jobs", {}, settings.http_token)
    assert "401" not in str(err.value)


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_post_store_needs_the_token_and_reaches_keep(serve):
    got: list[bytes] = []
    api = serve(token=Secret(TOKEN), keep=lambda body: got.append(body) or {"records": 0})
    assert post(api.url + "/store", b"abc")[0] == 401 and not got
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post(api.url + "/store", b"abc", auth) == (200, {"records": 0}) and got == [b"abc"]
    code, body = post(api.url + "/elsewhere", b"", auth)
    assert code == 404 and "use /store" in body["error"]


def test_post_store_is_not_offered_without_a_writer(serve):
    code, body = post(serve().url + "/store", b"abc")
    assert code == 404 and "no such endpoint" in body["error"]
