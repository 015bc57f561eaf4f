"""The sink service end to end: tansu -> sink -> chDB -> diagnose/query."""

from __future__ import annotations

import json

import pytest
from perftracker.deploy.state import StackState
from perftracker.sinks import client, samples

from .conftest import wait_for

pytestmark = pytest.mark.integration


def test_records_reach_the_store_and_diagnose(sink_settings, start_sink, produce, unique):
    job = f"job-{unique}"
    sink = start_sink(sink_settings)
    ready = json.loads(sink.ready.read_text())
    assert ready["query_url"].startswith("http://127.0.0.1:")
    records = list(samples.job_records(job, world=4, windows=2))
    produce(sink_settings, records, raw=[b"not avro at all"])
    # the CLI finds the sink through stack.json and asks its query API
    StackState(bootstrap="", broker_pid=0, sink_pid=__import__("os").getpid(),
               query_url=ready["query_url"]).save(sink_settings.data_dir)
    found = wait_for(lambda: client.diagnose(sink_settings, job), 30)
    assert found[0]["ranks"] == [3] and found[0]["cause"] == "slow_dataloader"
    assert found[0]["evidence"]["late_arrivals"] == 45
    for key in ("kind", "cause", "ranks", "hosts", "function", "score", "impact_ms_per_step",
                "first_seen", "last_seen", "evidence", "summary", "status", "incident_id"):
        assert key in found[0]
    wait_for(lambda: sink.service.stats.dead_lettered == 1, 10)
    steps = wait_for(lambda: client.query(sink_settings, "step_times", job=job), 10)
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}
    slow = client.query(sink_settings, "rank_function_slowdown", job=job)
    worst = max(slow, key=lambda r: r["slowdown"])
    assert worst["rank"] == 3 and "DataLoader" in worst["function"]
