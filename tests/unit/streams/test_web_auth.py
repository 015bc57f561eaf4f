"""The worker's Faust web server over real HTTP: bound to streams.web_host, bearer token when configured."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import Secret, Settings, StreamSettings
from perftracker_ml.streams.app import create_app

TOKEN = "w-t0ken-42"


def get(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def serve_and_get(settings: Settings, requests: list[dict[str, str]]) -> tuple[str, list[tuple[int, dict]]]:
    """Start only the app's web server (no broker needed), send ``requests`` (header sets) to
    /perftracker/stats/; (bound address, answers)."""
    app = create_app(settings, "127.0.0.1:1")

    async def run() -> tuple[str, list[tuple[int, dict]]]:
        await app.web.start_server()
        try:
            host, port = app.web._runner.addresses[0][:2]
            url = f"http://127.0.0.1:{port}/perftracker/stats/"
            loop = asyncio.get_running_loop()
            answers = [await loop.run_in_executor(None, get, url, h) for h in requests]
            return host, answers
        finally:
            await app.web.stop_server()

    return asyncio.run(run())


def test_worker_web_binds_loopback_by_default():
    host, [(code, body)] = serve_and_get(Settings(streams=StreamSettings(web_port=free_port())), [{}])
    assert host == "127.0.0.1"  # not Faust's default 0.0.0.0
    assert code == 200 and "counters" in body and body["assigned"] == []


def test_worker_web_with_a_token_needs_it():
    settings = Settings(http_token=Secret(TOKEN), streams=StreamSettings(web_port=free_port()))
    _, answers = serve_and_get(settings, [{}, {"Authorization": "Bearer nope"},
                                          {"Authorization": f"Bearer {TOKEN}"}])
    assert [code for code, _ in answers] == [401, 401, 200]
    assert "bearer token" in answers[0][1]["error"]


def test_worker_web_beyond_loopback_needs_a_token():
    with pytest.raises(ConfigError, match="streams.web_host = 0.0.0.0"):
        create_app(Settings(streams=StreamSettings(web_host="0.0.0.0", web_port=free_port())), "127.0.0.1:1")
    settings = Settings(http_token=Secret(TOKEN), streams=StreamSettings(web_host="0.0.0.0", web_port=free_port()))
    host, answers = serve_and_get(settings, [{}, {"Authorization": f"Bearer {TOKEN}"}])
    assert host == "0.0.0.0" and [code for code, _ in answers] == [401, 200]
