"""Plain words for causes and evidence: what an on-call engineer reads on an incident card.

The words of each cause are in :data:`perftracker_ml.schemas.causes.CAUSES`; an id this
version does not know (a newer writer's) gets generic words."""

from __future__ import annotations

from typing import Any

from ...schemas.causes import CAUSES, Cause, CauseWords

_UNITS = (("_ms_per_step", " (ms/step)"), ("_ms", " (ms)"), ("_ns", " (ns)"), ("_pct", " (%)"),
          ("_s", " (s)"), ("_mhz", " (MHz)"), ("_c", " (°C)"), ("_w", " (W)"))


def who(ranks: list[int], hosts: list[str]) -> str:
    if not ranks:
        return "all ranks"
    names = ", ".join(str(r) for r in ranks[:6]) + ("…" if len(ranks) > 6 else "")
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {names}{where}"


def _words(cause: str) -> CauseWords | None:
    """The table's words for a cause id; None for an id this version does not know."""
    try:
        return CAUSES[Cause(cause)]
    except ValueError:
        return None


def cause_title(cause: str) -> str:
    words = _words(cause)
    return words.title if words else cause.replace("_", " ").capitalize()


def explain(incident: dict[str, Any]) -> str:
    words = _words(incident.get("cause", ""))
    template = words.explanation if words else "{who} differs from its peers."
    return template.format(who=who(list(incident.get("ranks") or []), []))


def advice(cause: str) -> str:
    """What to check first; '' for an unknown cause."""
    words = _words(cause)
    return words.advice if words else ""


def label(key: str) -> str:
    """``peer_median_ms`` -> ``peer median (ms)``."""
    for suffix, unit in _UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value[:12]) + (" …" if len(value) > 12 else "")
    if isinstance(value, dict):
        return "; ".join(f"{label(str(k))}: {value_text(v)}" for k, v in list(value.items())[:8])
    return str(value)


def evidence_lines(evidence: Any) -> list[tuple[str, str]]:
    """(label, value) pairs of an incident's evidence object, in its own order."""
    if not isinstance(evidence, dict):
        return [("evidence", value_text(evidence))] if evidence else []
    return [(label(str(k)), value_text(v)) for k, v in evidence.items()]
