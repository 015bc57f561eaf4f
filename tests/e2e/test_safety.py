"""Safety: training is unaffected by a missing broker or by a failing hook."""

from __future__ import annotations

import json

import pytest
from perftracker.deploy.tansu import free_port

from .helpers import launch, torchrun

pytestmark = pytest.mark.e2e


def test_training_finishes_with_broker_down_and_drops_are_counted(tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens here
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": dead, "TRAIN_STEPS": "30",
           "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "PERFTRACKER_COLLECTOR_STATS_FILE": str(tmp_path / "stats-{rank}.json"),
           "TRAIN_REPORT": str(tmp_path / "report.json")}
    code, seconds = launch(torchrun("train_ddp.py"), "job-down", env)
    assert code == 0
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == 30
    for rank in range(4):
        stats = json.loads((tmp_path / f"stats-{rank}.json").read_text())
        assert stats["events_sent"] == 0
        assert stats["events_buffered"] == 0
        # every iteration, span and collective recorded was lost, and said so
        assert stats["events_dropped"] >= 30 * 6
        assert stats["step"] == 29
