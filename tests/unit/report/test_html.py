"""render_html from plain dicts: every panel, escaping, no network references."""

from __future__ import annotations

import json
import re
from html import escape

from perftracker_ml.schemas.causes import CAUSES, Cause
from perftracker_ml.sinks.report import json_path_for, render_html, write_report_files
from perftracker_ml.sinks.report.data import epoch_s, normalize_step_times
from perftracker_ml.sinks.report.html import render_card
from perftracker_ml.sinks.report.scale import (
    K_SLOWEST,
    MAX_CULPRITS,
    compact_ranks,
    gpu_hours_per_day,
    percentile,
    pick_ranks,
)
from perftracker_ml.sinks.report.svg import (
    LEGEND_ROWS,
    nice_max,
    slowdown_color,
    step_time_chart,
    y_range,
)

from .sample import (
    FAULT_S,
    LARGE_CULPRIT,
    LARGE_SLOW_HOST,
    T0,
    advice_row,
    incident,
    large_report_data,
    report_data,
)


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


def test_cost_in_gpu_hours_per_day_and_its_formula() -> None:
    page = render_html(report_data())  # 12.4 ms of a 37.0 ms step on 4 ranks
    assert "≈ 32.2 GPU-hours per day (12.4 ms ÷ 37.0 ms × 4 ranks × 24 h)" in page
    assert "(≈ 32.2 GPU-hours per day)" in page[page.index('id="verdict"'):page.index('id="incidents"')]
    assert "Cost in GPU-hours per day = impact (ms per step) ÷ step time (ms) × ranks in the job (4) × 24 h" in page
    assert gpu_hours_per_day(12.4, 0.0, 4) is None and gpu_hours_per_day(10.0, 100.0, 1024) == 0.1 * 1024 * 24
    assert "GPU-hours" not in render_card(incident())  # no rank count given: no cost


def test_advice_has_its_own_section_and_is_no_incident() -> None:
    page = render_html(report_data([incident(), advice_row()]))
    assert page.count('class="card incident') == 1 and page.count('class="card shape"') == 1
    incidents = page[page.index('id="incidents"'):page.index('id="advice"')]
    advice = page[page.index('id="advice"'):page.index('id="step-times"')]
    assert "Pipeline stage imbalance" not in incidents and "Pipeline stage imbalance" in advice
    assert "Advice (no fault)" in advice and "advice · no fault" in advice
    assert "(and 1 more)" not in page and "1 piece of advice about the job&#x27;s shape" in page
    assert page.count('class="marker marker-detected"') == 1  # the advice is not marked as detected
    only = render_html(report_data([advice_row()]))
    assert "No anomaly found" in only and 'id="advice"' in only and 'class="card incident' not in only
    assert 'data-rank="3" fill="none" stroke="#d62728"' not in only  # advice names no culprit
    assert 'id="advice"' not in render_html(report_data())


def test_charts_and_matrices_at_1024_ranks_name_only_the_culprits_and_the_slowest() -> None:
    data = large_report_data(1024)
    page = render_html(data)
    chart = page[page.index('id="step-times"'):page.index('id="heatmap"')]
    assert 1 <= chart.count('class="rank-line"') <= MAX_CULPRITS + K_SLOWEST
    assert f'data-rank="{LARGE_CULPRIT}" fill="none" stroke="#d62728"' in chart
    assert chart.count('class="legend-entry"') == 3 + 1 + K_SLOWEST <= LEGEND_ROWS
    assert 'class="band band-p50-p90"' in chart and 'class="p50-line"' in chart
    assert "1,024 ranks" in chart
    slowest = [int(r) for r in re.findall(r'class="rank-line" data-rank="(\d+)"', chart)]
    assert sum(r in LARGE_SLOW_HOST for r in slowest) == K_SLOWEST  # the slow host's ranks stand out
    heat = page[page.index('id="heatmap"'):page.index('id="late-arrivals"')]
    assert len(re.findall(r"<tr><th>rank \d+", heat)) == 1 + K_SLOWEST
    assert "other 1,018 ranks (median)" in heat and f"rank {LARGE_CULPRIT} (culprit)" in heat
    late = page[page.index('id="late-arrivals"'):]
    assert len(re.findall(r"<th>rank \d+", late)) == 1 + K_SLOWEST and "other 1,018 ranks (highest)" in late
    assert "17.2 ms/step caused" in late
    assert "768-1023 (256 ranks)" in page[page.index('id="advice"'):page.index('id="step-times"')]
    assert f"≈ {38.4 / 218.0 * 1024 * 24:,.0f} GPU-hours per day" in page
    assert len(page) < 400_000


def test_many_culprits_are_counted_not_listed() -> None:
    data = large_report_data(1024)
    data["incidents"][0]["ranks"] = list(range(0, 512, 2))  # 256 culprits
    page = render_html(data)
    chart = page[page.index('id="step-times"'):page.index('id="heatmap"')]
    assert chart.count('class="rank-line"') <= MAX_CULPRITS + K_SLOWEST
    assert f"+{256 - MAX_CULPRITS} more culprits" in chart
    assert chart.count('class="legend-entry"') <= LEGEND_ROWS
    assert f"{256 - MAX_CULPRITS} more culprits not shown" in page


def test_marker_labels_stay_inside_the_plot() -> None:
    """A marker near the right edge puts its label on its left; one too long for either side is cut."""
    series = {r: [(T0 + 5 * w, 20.0 + r) for w in range(10)] for r in range(3)}
    near_end = step_time_chart(series, [{"t": T0 + 44, "kind": "detected", "label": "detected: Slow data loader"}],
                               {1}, T0)
    assert 'text-anchor="end" fill="#ff7f0e" class="marker-label">detected: Slow data loader<' in near_end
    long = step_time_chart(series, [{"t": T0 + 20, "kind": "fault", "label": "x" * 200}], set(), T0)
    shown = re.search(r'class="marker-label">(x+…)<', long)
    assert shown and len(shown.group(1)) < 100 and "x" * 200 in long  # the whole label stays as the tooltip


def test_scale_helpers() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0 and percentile([5.0], 0.99) == 5.0
    assert percentile([0.0, 10.0], 0.9) == 9.0
    scores = {r: float(r % 7) for r in range(20)}  # ranks 6 and 13 score highest
    assert pick_ranks(scores, {5, 12, 19}, k=2, max_culprits=2) == ([5, 12], [6, 13], 1)
    assert pick_ranks({0: 1.0, 1: 5.0, 2: 3.0}, {0}, k=1) == ([0], [1, 2], 0)  # a small job: every rank
    assert compact_ranks([3, 1, 2]) == "1, 2, 3" and compact_ranks([]) == ""
    assert compact_ranks([0, 1, 2, 3, 4, 5, 9, 11, 12]) == "0-5, 9, 11-12 (9 ranks)"
    assert y_range(180.0, 222.0) == (160.0, 240.0, 20.0)  # far above 0: the spread stays visible
    assert y_range(1.0, 38.0) == (0.0, 40.0, 10.0)


def test_the_card_says_which_rule_named_or_cleared_which_rank() -> None:
    decisions = [{"rank": 2, "rule": "stragglers", "action": "flagged", "reason": "last into g"},
                 {"rank": 2, "rule": "late_entries", "action": "added", "reason": "slow_function on g",
                  "identity": "late|2"},
                 {"rank": 0, "rule": "stragglers", "action": "cleared", "reason": "a <propagated> victim"}]
    inc = incident()
    card = render_card(dict(inc, evidence={**inc["evidence"], "decisions": decisions}))
    assert "rank 2: named by rule <code>late_entries</code>: slow_function on g" in card
    assert "rank 0: cleared by rule <code>stragglers</code>: a &lt;propagated&gt; victim" in card
    assert "last into g" not in card and "Decisions" not in card  # flags and the raw entries left out
