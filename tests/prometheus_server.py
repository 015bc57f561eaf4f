"""A real Prometheus for the tests (Debian's binary; ``python -m tests`` installs it): a
fixture that starts one on loopback scraping every second, and an instant PromQL query."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import free_port

from .system_binaries import require, stop


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """start(scrape_configs yaml) -> the base URL of a Prometheus scraping every second."""
    procs: list[subprocess.Popen] = []

    def start(scrape_configs: str) -> str:
        binary = require("prometheus", "prometheus")
        config = tmp_path / "prometheus.yaml"
        config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n" + scrape_configs)
        port = free_port()
        log = (tmp_path / "prometheus.log").open("w")
        procs.append(subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        stop(p, 30)


def query(base: str, promql: str) -> list[dict]:
    """The instant vector of ``promql`` (empty while Prometheus is not up yet)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
    except OSError:
        return []
    assert body["status"] == "success", body
    return body["data"]["result"]


