"""The collector's opt-in Prometheus endpoint (PERFTRACKER_COLLECTOR_METRICS_PORT + LOCAL_RANK).

Each case runs `attach()` in a fresh interpreter: no hooks leak into this process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from perftracker_ml.deploy.tansu import free_port

SCRIPT = """
import sys, urllib.request
{block}
from perftracker_ml.collectors import attach, detach
env = {{"PERFTRACKER_DATA_DIR": {data_dir!r}, "PERFTRACKER_COLLECTOR_METRICS_PORT": "{base}",
        "RANK": "3", "LOCAL_RANK": "1", "PERFTRACKER_COLLECTOR_NVML_INTERVAL_S": "0"}}
collector = attach("job-m", env=env)
assert collector is not None
try:
    with urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        print(resp.read().decode())
except OSError as exc:
    print("NO ENDPOINT", type(exc).__name__)
detach()
try:
    urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=2)
    print("STILL SERVING")
except OSError:
    pass
"""


def run(tmp_path: Path, block: str = "") -> subprocess.CompletedProcess:
    port = free_port()
    code = SCRIPT.format(block=block, data_dir=str(tmp_path), base=port - 1, port=port)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_endpoint_serves_the_collector_counters_with_job_and_rank_then_stops(tmp_path: Path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'perftracker_collector_events_sent_total{rank="3",training_job="job-m"} 0.0' in proc.stdout
    assert "# TYPE perftracker_collector_events_in_flight gauge" in proc.stdout
    assert "STILL SERVING" not in proc.stdout


def test_without_prometheus_client_it_logs_one_line_and_stays_off(tmp_path: Path):
    proc = run(tmp_path, block="sys.modules['prometheus_client'] = None")
    assert proc.returncode == 0, proc.stderr
    assert "NO ENDPOINT" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "prometheus-client" in line]
    assert len(lines) == 1 and "metrics endpoint off" in lines[0]
