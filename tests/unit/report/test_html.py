"""render_html from plain dicts: every panel, escaping, no network references."""

from __future__ import annotations

import json
import re
from html import escape

from perftracker.schemas.causes import CAUSES, Cause
from perftracker.sinks.report import json_path_for, render_html, write_report_files
from perftracker.sinks.report.data import epoch_s, normalize_step_times
from perftracker.sinks.report.svg import nice_max, slowdown_color

from .sample import incident, report_data


def test_page_has_every_panel_and_the_incident() -> None:
    page = render_html(report_data())
    for section in ("summary", "incidents", "step-times", "heatmap", "late-arrivals"):
        assert f'id="{section}"' in page
    assert "Slow data loader" in page and "rank 2" in page
    assert 'data-cause="slow_dataloader"' in page and 'data-ranks="2"' in page
    assert "12.4 ms per step" in page
    assert "peer median (ms)" in page  # evidence keys in words


def test_card_words_come_from_the_cause_table() -> None:
    words = CAUSES[Cause.SLOW_DATALOADER]
    page = render_html(report_data())
    assert escape(words.title) in page and escape(words.advice) in page
    assert escape(words.explanation.format(who="rank 2")) in page
    unknown = render_html(report_data([incident(cause="a_cause_from_a_newer_writer")]))
    assert "A cause from a newer writer" in unknown and "rank 2 differs from its peers." in unknown
    assert 'class="advice"' not in unknown


def test_fault_onset_and_detection_are_marked_on_the_step_time_chart() -> None:
    page = render_html(report_data())
    assert 'class="marker marker-fault"' in page and "fault injected: slow-dataloader" in page
    assert 'class="marker marker-detected"' in page
    assert page.count('class="rank-line"') == 4
    assert 'data-rank="2" fill="none" stroke="#d62728"' in page  # the culprit's line stands out


def test_heatmap_and_late_arrival_matrix_show_culprit_and_victims() -> None:
    page = render_html(report_data())
    assert "3.95×" in page  # rank 2's data loader against the peer median
    assert "97%" in page  # rank 2 arrived last in 97% of the all_reduce calls


def test_self_contained_no_network_references() -> None:
    page = render_html(report_data())
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_strings_from_the_store_are_escaped() -> None:
    evil = incident(summary="<script>alert(1)</script>", function="f<b>", hosts=["h\"><img>"])
    page = render_html(report_data([evil]))
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert "<img>" not in page


def test_no_anomaly_and_empty_panels() -> None:
    data = report_data([])
    data.update(step_times=[], slowdown=[], late_arrivals=[], markers=[])
    page = render_html(data)
    assert "No anomaly found" in page
    assert "No step times stored" in page and "No collectives compared" in page


def test_write_report_files_writes_html_and_diagnosis_json(tmp_path) -> None:
    out = write_report_files(report_data(), tmp_path / "r" / "demo.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    rows = json.loads(json_path_for(out).read_text())
    assert rows[0]["cause"] == "slow_dataloader" and rows[0]["ranks"] == [2]
    for key in ("kind", "cause", "ranks", "hosts", "function", "score", "impact_ms_per_step",
                "first_seen", "last_seen", "evidence"):
        assert key in rows[0]


def test_time_and_axis_helpers() -> None:
    assert epoch_s("1970-01-01T00:01:40+00:00") == 100.0
    assert epoch_s("1970-01-01 00:01:40") == 100.0
    assert epoch_s(100_000) == 100_000.0 and epoch_s(1_790_000_000_000) == 1_790_000_000.0
    assert epoch_s("not a time") is None
    assert nice_max(37.0) == 50 and nice_max(0.7) == 1.0 and nice_max(120) == 200
    assert slowdown_color(1.0) == "rgb(255,255,255)"
    rows = normalize_step_times([{"window_start": "1970-01-01T00:00:10+00:00", "rank": 1,
                                  "step_time_ms": "3.5", "steps": 4}])
    assert rows == [{"t": 10.0, "rank": 1, "step_time_ms": 3.5, "steps": 4}]


def test_step_time_chart_without_markers() -> None:
    """A job with no fault has no onset or detection marker; the chart still draws."""
    data = report_data(incidents=[])
    data["markers"] = []
    page = render_html(data)
    assert page.count('class="rank-line"') == 4 and "marker-fault" not in page


def test_card_shows_stack_tops_and_cpu_evidence() -> None:
    ev = {"ratio": 1.4,
          "cpu": {"2": {"verdict": "contended", "runqueue_wait_ms_per_step": 10.5,
                        "peer_runqueue_wait_ms_per_step": 0.6}},
          "top_frames": {"2": [{"frame": "train.py:88 step `x.clone()`", "samples": 40, "share": 0.4}]},
          "location": {"2": {"frame": "train.py:88 step `x.clone()`", "extra_ms_per_step": 9.6}}}
    page = render_html(report_data([incident(cause="host_cpu_contention", evidence=ev)]))
    assert "Where the time goes" in page and escape("train.py:88 step `x.clone()`") in page
    assert "9.6 ms/step more than its peers" in page and "40% of samples" in page
    assert "waited for a CPU more than its peers" in page and "run-queue wait (ms/step) 10.5 vs 0.6" in page
    assert "<dt>cpu</dt>" not in page  # rendered in words, not as a raw evidence line
    old = render_html(report_data([incident(evidence={"cpu": {"1": {"verdict": "unavailable"}}})]))
    assert "CPU evidence unavailable" in old and "Where the time goes" not in old
