"""`perftracker worker` and `sink` refuse to serve HTTP beyond loopback without a bearer token."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("command, env", [
    ("worker", {"PERFTRACKER_STREAMS_WEB_HOST": "0.0.0.0"}),
    ("sink", {"PERFTRACKER_STORE_QUERY_HOST": "0.0.0.0"}),
])
def test_refused_before_anything_starts(tmp_path, command, env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    proc = subprocess.run([sys.executable, "-m", "perftracker_ml.deploy.cli", command],
                          env={**base, "PERFTRACKER_DATA_DIR": str(tmp_path),
                               "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "0.0.0.0 serves beyond this machine" in line and "PERFTRACKER_HTTP_TOKEN" in line
