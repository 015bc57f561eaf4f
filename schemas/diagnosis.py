"""The row ``perftracker diagnose --json`` prints for one incident, built in one place.

Both the live path (an ``incidents`` query row of the store) and the trace import (an
Anomaly record of the core) go through :func:`diagnosis_row`; only where the first/last
seen times come from differs, so the caller passes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ROW_FIELDS = ("incident_id", "job", "status", "kind", "cause", "ranks", "hosts", "gpus", "function", "score",
              "impact_ms_per_step", "step_time_ms", "first_seen", "last_seen", "windows", "summary", "evidence",
              "resolved_reason")


def evidence_of(incident: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed ``evidence_json``; text that is not JSON is kept under ``raw``."""
    try:
        return json.loads(incident.get("evidence_json") or "{}")
    except ValueError:
        return {"raw": incident.get("evidence_json")}


def diagnosis_row(incident: Mapping[str, Any], first_seen: Any, last_seen: Any) -> dict[str, Any]:
    """One incident (Anomaly record or ``incidents`` row) as a diagnosis row: the keys of
    :data:`ROW_FIELDS`, in that order; ``first_seen``/``last_seen`` as given (ISO-8601 text,
    or the store's own time value), ``evidence`` parsed, hosts that are unknown (empty
    names) left out."""
    return {
        "incident_id": incident["incident_id"], "job": incident["job"], "status": incident["status"],
        "kind": incident["kind"], "cause": incident["cause"], "ranks": list(incident["ranks"]),
        "hosts": [h for h in incident["hosts"] if h], "gpus": list(incident.get("gpus") or []),
        "function": incident["function"], "score": float(incident["score"]),
        "impact_ms_per_step": float(incident["impact_ms_per_step"]),
        "step_time_ms": float(incident.get("step_time_ms", 0.0)), "first_seen": first_seen,
        "last_seen": last_seen, "windows": int(incident.get("windows", 0)), "summary": incident["summary"],
        "evidence": evidence_of(incident), "resolved_reason": str(incident.get("resolved_reason") or ""),
    }


def remediation_text(a: dict[str, Any]) -> str:
    """One action of the remediation hook on an incident (an entry of a diagnosis row's
    ``remediation`` list), in words: `perftracker diagnose` and the report show it."""
    what = f"{a.get('action', '')} {a.get('node') or '(no node)'}"
    said = {"done": f"{what}: done", "dry_run": f"{what}: dry run, not run",
            "refused": f"{what} refused", "failed": f"{what} failed"}.get(str(a.get("outcome")), what)
    reason = f" ({a['reason']})" if a.get("reason") and a.get("outcome") != "dry_run" else ""
    command = f": {a['command']}" if a.get("command") and a.get("outcome") in ("done", "dry_run") else ""
    return f"remediation: {said}{reason}{command}"
