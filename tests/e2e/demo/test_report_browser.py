"""The HTML report opens in a real headless browser, without console errors, showing the incident,
at 8 ranks and at 1,024: every SVG text inside its chart, no horizontal scroll (measured in the
browser by a probe script run on a copy of the page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from perftracker_ml.sinks.report import write_report_files
from perftracker_ml.sinks.report.scale import K_SLOWEST, MAX_CULPRITS
from perftracker_ml.sinks.report.svg import LEGEND_ROWS

from tests.unit.report.sample import LARGE_CULPRIT, large_report_data, report_data

from .browser import LAYOUT_PROBE, chromium, open_page

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(chromium() is None, reason="chromium not installed "
                                 "(python -m tests installs Debian's chromium when run as root)")]


def _laid_out(result) -> dict:
    layout = result.probe
    assert layout is not None, "the layout probe did not run"
    assert layout["svgs"] >= 1 and layout["texts"] > 20
    assert layout["outside"] == [], f"SVG text outside its chart: {layout['outside'][:5]}"
    assert layout["scrollWidth"] <= layout["clientWidth"], "the page scrolls sideways"
    return layout


@pytest.mark.parametrize("world", [8, 1024])
def test_report_renders_at_any_rank_count(world: int, artifacts_dir: Path) -> None:
    data = report_data(world=8) if world == 8 else large_report_data(world)
    page = write_report_files(data, artifacts_dir / f"report-{world}-ranks.html")
    result = open_page(page, artifacts_dir / f"report-{world}-ranks.png", probe=LAYOUT_PROBE)
    assert result.console == ()
    _laid_out(result)
    dom = result.dom
    assert 'class="card incident' in dom and "Slow data loader" in dom
    assert "<svg" in dom and 'class="marker marker-fault"' in dom and "GPU-hours per day" in dom
    assert dom.count('class="rank-line"') <= MAX_CULPRITS + K_SLOWEST
    assert dom.count('class="legend-entry"') <= LEGEND_ROWS
    assert result.screenshot.stat().st_size > 10_000
    if world == 1024:
        assert f'data-rank="{LARGE_CULPRIT}"' in dom and 'class="band band-p90-p99"' in dom
        late = dom[dom.index('id="late-arrivals"'):]
        assert len(re.findall(r"<th>rank \d+", late)) <= MAX_CULPRITS + K_SLOWEST
        assert f"rank {LARGE_CULPRIT} (culprit)" in late and "other 1,018 ranks" in late
        advice = dom[dom.index('id="advice"'):dom.index('id="step-times"')]
        assert "Pipeline stage imbalance" in advice and "768-1023 (256 ranks)" in advice
        assert "Pipeline stage imbalance" not in dom[:dom.index('id="advice"')].split('id="incidents"')[1]


def test_the_layout_probe_itself_catches_overflow(tmp_path: Path) -> None:
    bad = tmp_path / "overflow.html"
    bad.write_text('<!DOCTYPE html><html><body><svg width="100" height="50"><text x="60" y="20">'
                   'far too long for its chart</text></svg><div style="width:5000px">wide</div></body></html>')
    layout = open_page(bad, tmp_path / "overflow.png", probe=LAYOUT_PROBE).probe
    assert [o["text"] for o in layout["outside"]] == ["far too long for its chart"]
    assert layout["scrollWidth"] > layout["clientWidth"]


def test_the_console_check_itself_catches_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom'); missingFn();</script>")
    result = open_page(bad, tmp_path / "bad.png")
    assert any("boom" in m for m in result.console)
    assert any("missingFn" in m for m in result.console)
