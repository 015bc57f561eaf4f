"""render_html from plain dicts: every panel, escaping, no network references."""

from __future__ import annotations

import json
import re
from html import escape

from perftracker_ml.schemas.causes import CAUSES, Cause
from perftracker_ml.sinks.report import json_path_for, render_html, write_report_files
from perftracker_ml.sinks.report.data import epoch_s, normalize_step_times
from perftracker_ml.sinks.report.html import render_card
from perftracker_ml.sinks.report.svg import nice_max, slowdown_color

from .sample import FAULT_S, incident, report_data


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


def test_hang_card_shows_the_culprit_s_current_stack() -> None:
    ev = {"stalled_s": 40.0, "stalled_ranks": [3],
          "stacks": {"3": [{"frame": "train.py:80 _stall `time.sleep(seconds)`", "samples": 120, "share": 0.96}]}}
    page = render_html(report_data([incident(kind="hang", cause="hang", evidence=ev)]))
    assert "Where the time goes" in page and escape("train.py:80 _stall `time.sleep(seconds)`") in page
    assert "96% of samples" in page and "<dt>stacks</dt>" not in page


def _marker_x(page: str, kind: str) -> float:
    m = re.search(rf'class="marker marker-{kind}" x1="([0-9.]+)"', page)
    assert m, f"no {kind} marker"
    return float(m.group(1))


def test_detected_marker_is_at_the_detection_time_after_the_onset() -> None:
    data = report_data()
    page = render_html(data)
    fault, detected = _marker_x(page, "fault"), _marker_x(page, "detected")
    assert detected > fault  # first_seen (the window start) is before the onset; detection is not
    assert data["incidents"][0]["first_seen_s"] < FAULT_S < data["incidents"][0]["detected_s"]
    data["incidents"][0]["detected_s"] = None  # a store without the OPEN history
    old = render_html(data)
    assert "marker-detected" not in old and "first seen: Slow data loader" in old
    assert _marker_x(old, "first-seen") < fault


def test_late_arrival_matrix_says_the_wait_the_incident_reports() -> None:
    inc = incident(kind="straggler", function="comm:all_reduce", impact_ms_per_step=15.3)
    page = render_html(report_data([inc]))
    matrix = page[page.index('id="late-arrivals"'):]
    assert "15.3 ms/step caused" in matrix and "0 ms caused" not in matrix
    assert matrix.count("ms/step caused") == 1  # the never-late ranks say nothing caused
    assert "11.8 ms/step caused" in render_html(report_data([]))  # no incident: the store's figure
    evidence = {"late_arrivals": [{"function": "comm:all_reduce", "late_seqs": 9, "late_fraction": 0.9,
                                   "caused_ms_per_step": 7.25}]}
    assert "7.2 ms/step caused" in render_html(report_data([incident(evidence=evidence)]))


def test_card_shows_each_fact_once_and_hides_unknown_ones() -> None:
    ev = {"function": "torch.utils.data.DataLoader.__next__", "windows": 6, "hardware": {}, "late_arrivals": [],
          "ratio": 26.3, "clock_mhz": -1}
    page = render_html(report_data([incident(gpus=[-1], hosts=["unknown"], evidence=ev)]))
    card = page[page.index('class="card incident'):page.index("</dl>")]
    assert card.count("<dt>function</dt>") == 1 and card.count("<dt>windows</dt>") == 1
    for hidden in ("<dt>GPUs</dt>", "<dt>hardware</dt>", "<dt>late arrivals</dt>", "<dt>hosts</dt>", "clock"):
        assert hidden not in card
    assert "on unknown" not in page and "<dt>ratio</dt>" in card
    shown = render_html(report_data([incident(gpus=[0, 3], hosts=["node7"])]))
    assert "<dt>GPUs</dt><dd>0, 3</dd>" in shown and "<dt>hosts</dt><dd>node7</dd>" in shown


def test_card_cpu_evidence_includes_host_load_and_faults_and_escapes_frames() -> None:
    ev = {"cpu": {"2": {"verdict": "contended", "cpu_ratio": 0.41, "peer_cpu_ratio": 0.95,
                        "involuntary_switches_per_step": 120.0, "peer_involuntary_switches_per_step": 3.0,
                        "steal_pct": 9.0, "peer_steal_pct": 0.5, "load1": 14.2, "major_faults": -1}},
          "top_frames": {"2": [{"frame": "<evil>.py:3 f `a<b`", "samples": 7, "share": 0.7}]},
          "location": {"frame": "train.py:88 step `x.clone()`", "extra_ms_per_step": 12.0}}
    page = render_html(report_data([incident(kind="straggler", cause="slow_function", evidence=ev)]))
    for text in ("thread CPU / wall 0.41 vs 0.95 on peers", "involuntary switches / step 120 vs 3 on peers",
                 "CPU steal (%) 9 vs 0.5 on peers", "host load (1 min) 14.2"):
        assert text in page
    assert "major page faults" not in page  # -1: not measured
    assert "<evil>" not in page and escape("<evil>.py:3 f `a<b`") in page
    assert "12 ms/step more than its peers" in page  # a late arriver's location (one frame, not per rank)


def test_resolved_card_says_why_it_ended_and_open_card_does_not() -> None:
    ended = dict(incident(), status="RESOLVED", resolved_reason="job finished")
    assert "RESOLVED · job finished" in render_card(ended)
    assert 'class="card incident resolved"' in render_card(ended)
    still = dict(incident(), status="OPEN", resolved_reason="")
    assert ">OPEN</span>" in render_card(still) and "job finished" not in render_card(still)
