"""``render_html(data) -> str``: the self-contained report page (inline CSS and SVG, no network).

``data`` is what :func:`perftracker_ml.sinks.report.data.build_report_data` returns
(plain dicts); every string from it is HTML-escaped here.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from ...schemas.vocabulary import Status
from .evidence import RENDERED_HERE, evidence_blocks
from .svg import share_color, slowdown_color, step_time_chart
from .words import advice, cause_title, evidence_lines, explain, who

CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header .meta{color:#b8c4d0;margin-top:4px}main{padding:8px 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}.verdict{font-size:16px;font-weight:600}
.verdict.ok{color:#22863a}.verdict.bad{color:#b31d28}.empty{color:#777;font-style:italic}
svg text{font-size:11px;fill:#444}svg .marker-label{font-size:12px;font-weight:600}
table.grid{border-collapse:collapse;font-size:12px}table.grid th,table.grid td{border:1px solid #e3e6ea;padding:4px 7px;text-align:right}
table.grid th{background:#f0f2f5;font-weight:600}table.grid th.fn{text-align:left;max-width:260px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.cards{display:flex;flex-wrap:wrap;gap:14px}.card{border:1px solid #dde2e8;border-left:6px solid #d62728;border-radius:6px;padding:12px 16px;flex:1 1 480px;background:#fff}
.card.resolved{border-left-color:#999;opacity:.85}.card h3{margin:0 0 4px;font-size:16px}
.badge{display:inline-block;font-size:11px;padding:1px 7px;border-radius:9px;background:#eee;margin-left:6px;vertical-align:middle}
.badge.open,.badge.updated{background:#fde2e1;color:#b31d28}.badge.resolved{background:#e6e6e6;color:#555}
.card dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0}.card dt{color:#666}.card dd{margin:0}
.card .summary{margin:6px 0;font-weight:500}.card .why{color:#333}.card .advice{color:#333;font-style:italic}.note{color:#666;font-size:12px}
.missing{color:#8a6d3b;background:#fcf8e3;padding:6px 10px;border-radius:4px}
"""


def _fmt_time(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + " UTC"


def _culprits(incidents: list[dict]) -> set[int]:
    return {r for inc in incidents for r in inc.get("ranks", [])}


def render_verdict(incidents: list[dict]) -> str:
    if not incidents:
        return '<p class="verdict ok" id="verdict">No anomaly found: the ranks behave like their peers.</p>'
    top = incidents[0]
    more = f" (and {len(incidents) - 1} more)" if len(incidents) > 1 else ""
    return (f'<p class="verdict bad" id="verdict">{escape(cause_title(top.get("cause", "")))} on '
            f'{escape(who(top.get("ranks", []), known_hosts(top)))}, function '
            f'<code>{escape(str(top.get("function", "")))}</code>, costing '
            f'{top.get("impact_ms_per_step", 0.0):.1f} ms per step{escape(more)}.</p>')


def render_chart(data: dict) -> str:
    steps = data.get("step_times", [])
    series: dict[int, list[tuple[float, float]]] = {}
    for r in steps:
        series.setdefault(r["rank"], []).append((r["t"], r["step_time_ms"]))
    markers = list(data.get("markers", []))
    markers += [m for inc in data.get("incidents", []) if (m := _detection_marker(inc))]
    t0 = min([r["t"] for r in steps] + [m["t"] for m in markers if m.get("t")], default=0.0)
    return step_time_chart(series, markers, _culprits(data.get("incidents", [])), t0)


def _detection_marker(inc: dict) -> dict | None:
    """At the end of the window that opened the incident (``detected_s``), which is after the
    onset; an incident without it (an older store) is marked where it was first seen, and says so."""
    title = cause_title(str(inc.get("cause", "")))
    if inc.get("detected_s"):
        return {"t": inc["detected_s"], "kind": "detected", "label": f"detected: {title}"}
    if inc.get("first_seen_s"):
        return {"t": inc["first_seen_s"], "kind": "first-seen", "label": f"first seen: {title}"}
    return None


def render_heatmap(rows: list[dict]) -> str:
    if not rows:
        return '<p class="empty">No per-function statistics stored for this job.</p>'
    ranks = sorted({r["rank"] for r in rows})
    functions = sorted({r["function"] for r in rows})
    cell = {(r["rank"], r["function"]): r for r in rows}
    head = "".join(f'<th class="fn" title="{escape(f)}">{escape(".".join(f.split(".")[-2:])[:40])}</th>'
                   for f in functions)
    body = []
    for rank in ranks:
        tds = []
        for f in functions:
            r = cell.get((rank, f))
            if r is None:
                tds.append("<td></td>")
                continue
            tip = f"rank {rank} {f}: {r['ms_per_step']:.2f} ms/step, peer median {r['peer_median_ms']:.2f} ms"
            tds.append(f'<td style="background:{slowdown_color(r["slowdown"])}" title="{escape(tip)}">'
                       f'{r["slowdown"]:.2f}×</td>')
        body.append(f"<tr><th>rank {rank}</th>{''.join(tds)}</tr>")
    return (f'<table class="grid heatmap"><tr><th>rank \\ function</th>{head}</tr>{"".join(body)}</table>'
            '<p class="note">Time per step against the median rank (1.00× = like its peers). A red '
            'collective on most ranks means they <em>wait</em> there: see who arrives last below.</p>')


def incident_waits(incidents: list[dict]) -> dict[tuple[str, int], float]:
    """(collective, rank) -> the wait per step an incident says the rank causes there: a
    straggler incident's impact, or a rank finding's ``late_arrivals`` evidence."""
    out: dict[tuple[str, int], float] = {}
    for inc in incidents:
        ev = inc.get("evidence")
        lates = ev.get("late_arrivals") if isinstance(ev, dict) else None
        ranks = [int(r) for r in inc.get("ranks") or []]
        if inc.get("kind") == "straggler" and len(ranks) == 1:
            out.setdefault((str(inc.get("function", "")), ranks[0]), float(inc.get("impact_ms_per_step", 0.0)))
        for late in lates if isinstance(lates, list) else []:
            if isinstance(late, dict) and "function" in late and len(ranks) == 1:
                out.setdefault((str(late["function"]), ranks[0]), float(late.get("caused_ms_per_step", 0.0)))
    return out


def render_late_arrivals(rows: list[dict], incidents: list[dict] | None = None) -> str:
    if not rows:
        return '<p class="empty">No collectives compared for this job.</p>'
    ranks = sorted({r["rank"] for r in rows})
    functions = sorted({r["function"] for r in rows})
    cell = {(r["function"], r["rank"]): r for r in rows}
    told = incident_waits(incidents or [])
    head = "".join(f"<th>rank {r}</th>" for r in ranks)
    body = []
    for f in functions:
        tds = []
        for rank in ranks:
            r = cell.get((f, rank))
            if r is None or not r["collectives"]:
                tds.append("<td></td>")
                continue
            share = r["late_arrivals"] / r["collectives"]
            caused = told.get((f, rank), r["wait_caused_ms_per_step"])
            tip = (f"rank {rank} arrived last in {r['late_arrivals']} of {r['collectives']} {f} calls; "
                   f"the others waited {caused:.1f} ms per step for it")
            note = f'<br><span class="note">{caused:.1f} ms/step caused</span>' if caused > 0 else ""
            tds.append(f'<td style="background:{share_color(share)}" title="{escape(tip)}">{share:.0%}{note}</td>')
        body.append(f'<tr><th class="fn" title="{escape(f)}">{escape(f)}</th>{"".join(tds)}</tr>')
    return (f'<table class="grid late"><tr><th>collective \\ rank</th>{head}</tr>{"".join(body)}</table>'
            '<p class="note">Share of the calls in which the rank arrived last (the one the others '
            'waited for), and the wait it caused per step while it was late (its incident\'s figure). '
            'The culprit of a collective arrives last; its victims show long times inside the call.</p>')


FACT_KEYS = frozenset({"ranks", "hosts", "gpus", "function", "kind", "score", "windows", "impact_ms_per_step",
                       "first_seen", "last_seen", "step_time_ms"})  # shown once, as facts, not again as evidence
UNKNOWN_HOSTS = frozenset({"", "unknown"})


def known_hosts(inc: dict[str, Any]) -> list[str]:
    return [str(h) for h in inc.get("hosts") or [] if str(h) not in UNKNOWN_HOSTS]


def _known(value: Any) -> bool:
    """False for what says nothing: None, '', empty lists and dicts, the -1 of 'not measured'."""
    if value is None or value == "" or value == -1 or value == -1.0:
        return False
    return not (isinstance(value, (list, tuple, dict)) and not value)


def card_facts(inc: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's facts and evidence lines, each once; unknown or empty ones left out."""
    step_ms = inc.get("step_time_ms") or 0.0
    share = f" ({inc['impact_ms_per_step'] / step_ms:.0%} of the {step_ms:.1f} ms step)" if step_ms else ""
    gpus = [str(g) for g in inc.get("gpus") or [] if isinstance(g, int) and g >= 0]
    hosts = known_hosts(inc)
    facts = [("ranks", ", ".join(map(str, inc.get("ranks", []))) or "all"), ("hosts", ", ".join(hosts)),
             ("GPUs", ", ".join(gpus)), ("function", str(inc.get("function", ""))), ("kind", str(inc.get("kind", ""))),
             ("impact", f"{inc['impact_ms_per_step']:.1f} ms per step{share}"),
             ("score", f"{inc['score']:.1f}"), ("first seen", _fmt_time(inc.get("first_seen_s"))),
             ("last seen", _fmt_time(inc.get("last_seen_s"))), ("windows", str(inc.get("windows") or ""))]
    facts = [(k, v) for k, v in facts if v not in ("", "-")]
    ev = inc.get("evidence")
    if isinstance(ev, dict):
        ev = {k: v for k, v in ev.items() if k not in RENDERED_HERE and k not in FACT_KEYS and _known(v)}
    return facts + evidence_lines(ev)


def render_card(inc: dict[str, Any]) -> str:
    status = str(inc.get("status", Status.OPEN.value))
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in card_facts(inc))
    return (f'<div class="card incident {"resolved" if status == Status.RESOLVED else ""}" '
            f'data-cause="{escape(str(inc.get("cause", "")))}" data-ranks="{escape(",".join(map(str, inc.get("ranks", []))))}">'
            f'<h3>{escape(cause_title(str(inc.get("cause", ""))))} — {escape(who(inc.get("ranks", []), known_hosts(inc)))}'
            f'<span class="badge {status.lower()}">{escape(status_text(inc))}</span></h3>'
            f'<p class="summary">{escape(str(inc.get("summary", "")))}</p>'
            f'<p class="why">{escape(explain(inc))}</p>{_advice_line(inc)}{evidence_blocks(inc.get("evidence"))}'
            f'<dl>{dl}</dl></div>')


def status_text(inc: dict[str, Any]) -> str:
    """The badge: the status, and for a resolved incident why it ended ("RESOLVED · job finished")."""
    status = str(inc.get("status", Status.OPEN.value))
    reason = str(inc.get("resolved_reason") or "")
    return f"{status} · {reason}" if status == Status.RESOLVED and reason else status


def _advice_line(inc: dict[str, Any]) -> str:
    text = advice(str(inc.get("cause", "")))
    return f'<p class="advice">What to check: {escape(text)}</p>' if text else ""


def render_html(data: dict) -> str:
    """The whole page for one job from plain report data."""
    incidents = data.get("incidents", [])
    cards = "".join(render_card(i) for i in incidents) or \
        '<p class="empty">No root cause was reported for this job.</p>'
    missing = "".join(f'<p class="missing">Not available: {escape(m)}</p>' for m in data.get("missing", []))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(data.get("title", "perftracker report"))}</title><style>{CSS}</style></head>
<body><header><h1>{escape(data.get("title", "perftracker report"))}</h1>
<div class="meta">job <b>{escape(str(data.get("job", "")))}</b> · generated {_fmt_time(data.get("generated_s"))}</div></header>
<main>{missing}<section id="summary"><h2>Diagnosis</h2>{render_verdict(incidents)}</section>
<section id="incidents"><h2>Root causes, most costly first</h2><div class="cards">{cards}</div></section>
<section id="step-times"><h2>Step time per rank</h2>{render_chart(data)}</section>
<section id="heatmap"><h2>Slowdown against peers: rank × function</h2>{render_heatmap(data.get("slowdown", []))}</section>
<section id="late-arrivals"><h2>Collective late arrivals</h2>{render_late_arrivals(data.get("late_arrivals", []), incidents)}</section>
</main></body></html>
"""
