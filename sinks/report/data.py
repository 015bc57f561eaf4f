"""Gather what a report shows from the store, as plain dicts of numbers and strings.

``build_report_data`` is the only part that talks to the store (through the
named queries of :mod:`perftracker_ml.sinks.client`); everything it returns is
JSON-serializable and is all :func:`perftracker_ml.sinks.report.html.render_html`
needs, so rendering is tested without a store. Times become epoch seconds.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

REPORT_QUERIES = {"step_times": "step_times", "slowdown": "rank_function_slowdown",
                  "late_arrivals": "collective_late_arrivals"}


def epoch_s(value: Any) -> float | None:
    """ISO 8601 string, datetime, or epoch seconds/milliseconds -> epoch seconds (None if unknown)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    if isinstance(value, (int, float)):
        return float(value) / 1000.0 if value > 1e11 else float(value)
    try:
        text = str(value).replace("Z", "+00:00").replace(" ", "T", 1)
        return epoch_s(datetime.fromisoformat(text))
    except ValueError:
        return None


def _num(value: Any, default: float = 0.0) -> float:
    """A finite float (NaN from an aggregate over no rows, text, None -> ``default``)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def normalize_step_times(rows: list[dict]) -> list[dict]:
    out = [{"t": epoch_s(r.get("window_start")), "rank": int(r.get("rank", -1)),
            "step_time_ms": _num(r.get("step_time_ms")), "steps": int(_num(r.get("steps")))}
           for r in rows]
    return sorted((r for r in out if r["t"] is not None), key=lambda r: (r["t"], r["rank"]))


def normalize_slowdown(rows: list[dict]) -> list[dict]:
    return [{"rank": int(r.get("rank", -1)), "function": str(r.get("function", "")),
             "ms_per_step": _num(r.get("ms_per_step")), "peer_median_ms": _num(r.get("peer_median_ms")),
             "slowdown": _num(r.get("slowdown"))} for r in rows]


def normalize_late_arrivals(rows: list[dict]) -> list[dict]:
    """``collective_late_arrivals`` rows; the wait caused is per step, averaged over the windows
    the rank arrived late in (the figure its incident reports)."""
    return [{"function": str(r.get("function", "")), "rank": int(r.get("rank", -1)),
             "late_arrivals": int(_num(r.get("late_arrivals"))), "collectives": int(_num(r.get("collectives"))),
             "wait_caused_ms_per_step": _num(r.get("wait_caused_ms_per_step")),
             "late_windows": int(_num(r.get("late_windows")))}
            for r in rows]


def normalize_incident(row: dict) -> dict:
    out = dict(row)
    out["first_seen_s"] = epoch_s(row.get("first_seen"))
    out["last_seen_s"] = epoch_s(row.get("last_seen"))
    out["ranks"] = [int(r) for r in row.get("ranks") or []]
    out["hosts"] = [str(h) for h in row.get("hosts") or []]
    out["impact_ms_per_step"] = _num(row.get("impact_ms_per_step"))
    out["score"] = _num(row.get("score"))
    out["step_time_ms"] = _num(row.get("step_time_ms"))
    out["detected_s"] = epoch_s(row.get("detected_s"))
    return out


def build_report_data(settings: Any, job: str, markers: list[dict] | None = None,
                      title: str = "") -> dict:
    """Everything the report shows for ``job``; ``markers`` are ``{"t": epoch_s, "label": str}``."""
    from ..client import diagnose, query

    data: dict[str, Any] = {"job": job, "title": title or f"perftracker report: {job}",
                            "generated_s": time.time(), "markers": list(markers or []),
                            "missing": []}
    for key, name in REPORT_QUERIES.items():
        try:
            rows = query(settings, name, job=job)
        except Exception as exc:  # one missing panel must not lose the whole report
            data["missing"].append(f"{name}: {exc}")
            rows = []
        data[key] = {"step_times": normalize_step_times, "slowdown": normalize_slowdown,
                     "late_arrivals": normalize_late_arrivals}[key](rows)
    data["diagnosis"] = diagnose(settings, job, include_resolved=True)  # the `diagnose --json` rows
    data["incidents"] = [normalize_incident(r) for r in data["diagnosis"]]
    try:
        opened = {str(r["incident_id"]): r.get("opened") for r in query(settings, "incident_opened", job=job)}
    except Exception as exc:  # without it the chart marks "first seen" instead of "detected"
        data["missing"].append(f"incident_opened: {exc}")
        opened = {}
    for inc in data["incidents"]:
        inc["detected_s"] = epoch_s(opened.get(str(inc.get("incident_id"))))
    return data
