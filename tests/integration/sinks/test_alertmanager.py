"""The Alertmanager channel against a real Alertmanager, which notifies a real local webhook receiver."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.sinks.alerts.alertmanager import ALERTNAME, AlertmanagerChannel
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher, AlertPolicy
from perftracker_ml.sinks.alerts.worker import DeliveryPolicy

from ...system_binaries import require, stop
from .conftest import wait_for
from .receiver import Receiver

pytestmark = pytest.mark.integration


CONFIG = """
route:
  receiver: oncall
  group_by: [alertname, training_job]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
- name: oncall
  webhook_configs:
  - url: {url}
    send_resolved: true
"""


@dataclass
class RunningAlertmanager:
    url: str
    receiver: Receiver
    log: Path

    def alerts(self) -> list[dict]:
        """Alertmanager's active alerts of perftracker (GET /api/v2/alerts)."""
        query = urllib.request.quote(f'alertname="{ALERTNAME}"')
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?filter={query}", timeout=5) as r:
            return json.loads(r.read())

    def notifications(self) -> list[dict]:
        """What Alertmanager sent the receiver (webhook payloads), in order."""
        return [r.json() for r in self.receiver.received]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[RunningAlertmanager]:
    # upstream's name where it is installed so, else Debian's (what `python -m tests` installs)
    binary = shutil.which("alertmanager") or require("prometheus-alertmanager", "prometheus-alertmanager")
    with Receiver() as rx:
        config = tmp_path / "alertmanager.yml"
        config.write_text(CONFIG.format(url=rx.url + "/alertmanager"))
        port = free_port()
        log = tmp_path / "alertmanager.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                    stdout=out, stderr=subprocess.STDOUT)
        am = RunningAlertmanager(f"http://127.0.0.1:{port}", rx, log)
        try:
            wait_for(lambda: proc.poll() is not None or _ready(am.url), 60, 0.2, describe=log.read_text)
            if proc.poll() is not None:
                pytest.fail(f"Alertmanager exited {proc.returncode}: {log.read_text()[-2000:]}")
            yield am
        finally:
            stop(proc, 10)


def when(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_an_incident_is_one_alert_grouped_notified_and_resolved(alertmanager: RunningAlertmanager):
    am = alertmanager
    channel = AlertmanagerChannel(am.url, resend_s=1.0)
    d = AlertDispatcher([channel], AlertPolicy(update_interval_s=0.0, dashboard_url="https://grafana.example",
                                               delivery=DeliveryPolicy(max_attempts=6, retry_base_s=0.1)))
    d.start()
    try:
        t0 = time.time()
        d.submit(samples.anomaly("job-am", incident_id="inc-am", status="OPEN", last_seen_s=t0 - 30))
        (alert,) = wait_for(am.alerts, 60, 0.2, describe=lambda: am.log.read_text()[-2000:])
        assert alert["labels"] == {"alertname": ALERTNAME, "training_job": "job-am", "incident_id": "inc-am",
                                   "cause": "slow_dataloader", "kind": "straggler", "severity": "error",
                                   "host": "node-000", "ranks": "3"}
        assert alert["status"]["state"] == "active"
        assert "rank 3 on node-000" in alert["annotations"]["description"]
        assert alert["generatorURL"].startswith("https://grafana.example/d/perftracker-job/")

        # two updates (costlier, another rank): still one alert, Alertmanager holds the latest words
        d.submit(samples.anomaly("job-am", incident_id="inc-am", status="UPDATED", impact_ms=40.0,
                                 last_seen_s=t0 - 20))
        d.submit(samples.anomaly("job-am", incident_id="inc-am", status="UPDATED", impact_ms=70.0, rank=4,
                                 last_seen_s=t0 - 10))
        wait_for(lambda: [a for a in am.alerts() if "70.0 ms per step" in a["annotations"]["description"]],
                 60, 0.2, describe=am.alerts)
        (updated,) = am.alerts()
        assert updated["fingerprint"] == alert["fingerprint"] and updated["labels"] == alert["labels"]

        # the resend keeps it firing: Alertmanager's endsAt moves on while the incident is open
        wait_for(lambda: [a for a in am.alerts() if when(a["endsAt"]) > when(updated["endsAt"])], 60, 0.2,
                 describe=am.alerts)
        assert len(am.alerts()) == 1

        # the receiver gets the group: one alert of the incident in each firing notification
        firing = wait_for(lambda: [n for n in am.notifications() if n["status"] == "firing"], 60, 0.2,
                          describe=am.notifications)
        for n in firing:
            assert [a["labels"]["incident_id"] for a in n["alerts"]] == ["inc-am"]
            assert n["groupLabels"] == {"alertname": ALERTNAME, "training_job": "job-am"}

        # resolving the incident makes Alertmanager send the resolution
        d.submit({**samples.anomaly("job-am", incident_id="inc-am", status="RESOLVED", rank=4,
                                    last_seen_s=t0 - 5), "resolved_reason": "cleared"})
        resolved = wait_for(lambda: [n for n in am.notifications() if n["status"] == "resolved"], 60, 0.2,
                            describe=am.notifications)
        (gone,) = resolved[0]["alerts"]
        assert gone["status"] == "resolved" and gone["labels"] == alert["labels"]
        assert gone["annotations"]["resolved_reason"] == "cleared"
        assert channel.firing() == 0  # no more resends after the resolution
        assert d.stats()["alertmanager"]["failed"] == 0
    finally:
        d.stop()
