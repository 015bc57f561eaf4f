"""The HTML report opens in a real headless browser, without console errors, showing the incident."""

from __future__ import annotations

from pathlib import Path

import pytest
from perftracker_ml.sinks.report import write_report_files

from tests.unit.report.sample import report_data

from .browser import chromium, open_page

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(chromium() is None, reason="chromium not installed "
                                 "(python -m tests installs Debian's chromium when run as root)")]


def test_report_renders_in_chromium_without_console_errors(artifacts_dir: Path, tmp_path: Path) -> None:
    page = write_report_files(report_data(), artifacts_dir / "report-sample.html")
    result = open_page(page, artifacts_dir / "report-sample.png")
    assert result.console == ()
    assert 'class="card incident' in result.dom and "Slow data loader" in result.dom
    assert "<svg" in result.dom and 'class="marker marker-fault"' in result.dom
    assert result.screenshot.stat().st_size > 10_000


def test_the_console_check_itself_catches_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom'); missingFn();</script>")
    result = open_page(bad, tmp_path / "bad.png")
    assert any("boom" in m for m in result.console)
    assert any("missingFn" in m for m in result.console)
