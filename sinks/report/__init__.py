"""The job report: a self-contained HTML page plus the same diagnosis as JSON.

``write_report(settings, job, out)`` reads the store (named queries only) and
writes ``out`` (HTML) and ``out.with_suffix(".json")`` (the ``perftracker
diagnose --json`` rows, resolved ones included). ``render_html(data)`` is the
pure part, fed with plain dicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...schemas.errors import PerftrackerError
from .data import build_report_data
from .html import render_html

__all__ = ["ReportError", "build_report_data", "json_path_for", "render_html", "write_report",
           "write_report_files"]


class ReportError(PerftrackerError):
    """A report could not be written."""


def json_path_for(out: Path) -> Path:
    return out.with_suffix(".json") if out.suffix.lower() in (".html", ".htm") else Path(str(out) + ".json")


def write_report_files(data: dict[str, Any], out: Path) -> Path:
    """Write the HTML page and the JSON diagnosis beside it from report ``data``; returns ``out``."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(data), encoding="utf-8")
        json_path_for(out).write_text(json.dumps(data.get("diagnosis", []), indent=2, default=str) + "\n")
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror}; pick a writable --out") from None
    return out


def write_report(settings: Any, job: str, out: Path, markers: list[dict] | None = None,
                 title: str = "") -> Path:
    """Report of ``job`` from the store to ``out`` (HTML) and its JSON twin; returns ``out``."""
    if not job:
        raise ReportError("a job id is needed: perftracker report --job ID --out FILE.html")
    return write_report_files(build_report_data(settings, job, markers=markers, title=title), Path(out))
