"""build_report_data: the store's rows (through the named queries) to the report's dicts."""

from __future__ import annotations

import math

from perftracker_ml.sinks import client
from perftracker_ml.sinks.report.data import build_report_data, normalize_late_arrivals

from .sample import incident


def test_late_arrival_rows_keep_the_per_step_wait_and_drop_nan() -> None:
    rows = normalize_late_arrivals([
        {"function": "comm:all_reduce", "rank": 2, "late_arrivals": 4, "collectives": 6,
         "wait_caused_ms_per_step": 15.3, "late_windows": 3},
        {"function": "comm:all_reduce", "rank": 1, "late_arrivals": 0, "collectives": 6,
         "wait_caused_ms_per_step": math.nan, "late_windows": 0}])  # avgIf over no late window
    assert [r["wait_caused_ms_per_step"] for r in rows] == [15.3, 0.0] and rows[0]["late_windows"] == 3


def test_detection_time_comes_from_the_window_that_opened_the_incident(monkeypatch) -> None:
    """A narrow fake of the two client calls: the query names and rows the store answers with."""
    asked = []

    def query(settings, name, **params):
        asked.append(name)
        if name == "incident_opened":
            return [{"incident_id": "inc-1", "opened": "2026-09-21T14:13:55+00:00"}]
        return []

    monkeypatch.setattr(client, "query", query)
    monkeypatch.setattr(client, "diagnose", lambda settings, job, include_resolved: [incident()])
    data = build_report_data(None, "demo-1")
    (inc,) = data["incidents"]
    assert "incident_opened" in asked and not data["missing"]
    assert inc["first_seen_s"] < inc["detected_s"] == inc["first_seen_s"] + 15
