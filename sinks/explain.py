"""Why a rank was or was not named, from a job's stored incidents (``perftracker diagnose
--job J --explain RANK``).

Each incident's evidence keeps the decision trace of the window it was last sent for
(``evidence.decisions``, :mod:`perftracker_ml.streams.detect.decisions`): which rule flagged,
named or cleared which rank, and why. A rank an incident names is explained by the rules that
added it; a rank none names by the rules that cleared it; a rank no stored decision mentions
was never flagged: no outlier and no late arrival against its peers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..streams.detect.decisions import ADDED, CLEARED, FLAGGED, NOT_FLAGGED


def _decisions(row: Mapping[str, Any], rank: int) -> list[Mapping[str, Any]]:
    evidence = row.get("evidence") or {}
    entries = evidence.get("decisions") if isinstance(evidence, Mapping) else None
    return [d for d in entries or [] if isinstance(d, Mapping) and d.get("rank") == rank]


def _line(d: Mapping[str, Any]) -> str:
    what = {ADDED: f"named it in {d.get('identity') or 'a finding'}", CLEARED: "cleared it",
            FLAGGED: "flagged it"}.get(str(d.get("action")), str(d.get("action")))
    return f"  - rule {d.get('rule')} {what}: {d.get('reason')}"


def explain_rank(job: str, rank: int, rows: Iterable[Mapping[str, Any]]) -> str:
    """In words: why ``rank`` was or was not named by ``rows`` (the job's diagnosis rows,
    resolved ones included)."""
    rows = list(rows)
    named = [r for r in rows if rank in (r.get("ranks") or [])]
    out: list[str] = []
    if named:
        out.append(f"rank {rank} of job {job} was named in {len(named)} incident(s):")
        for r in named:
            out.append(f"* {r.get('incident_id')} {r.get('cause')} ({r.get('status')}): {r.get('summary')}")
            own = [d for d in _decisions(r, rank) if d.get("action") != FLAGGED] or _decisions(r, rank)
            out += [_line(d) for d in own] or ["  - (no decision trace stored with this incident)"]
        return "\n".join(out)
    seen = sorted(((r, d) for r in rows for d in _decisions(r, rank)), key=lambda x: x[1].get("action") != FLAGGED)
    if not seen:
        where = f"the windows of its {len(rows)} incident(s)" if rows else "no incident of the job"
        return f"rank {rank} of job {job} was not named: {NOT_FLAGGED} (in {where})"
    out.append(f"rank {rank} of job {job} was not named:")
    shown: set[tuple[str, str]] = set()
    for r, d in seen:
        key = (str(d.get("rule")), str(d.get("reason")))
        if key not in shown:
            shown.add(key)
            out.append(_line(d) + f" (window of incident {r.get('incident_id')}, {r.get('cause')})")
    if not any(d.get("action") == CLEARED for _, d in seen):
        out.append("  no rule cleared it, and no finding of the stored windows names it")
    return "\n".join(out)
