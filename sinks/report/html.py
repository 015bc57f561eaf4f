"""``render_html(data) -> str``: the self-contained report page (inline CSS and SVG, no network).

``data`` is what :func:`perftracker_ml.sinks.report.data.build_report_data` returns
(plain dicts); every string from it is HTML-escaped here.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from ...schemas.diagnosis import remediation_text
from ...schemas.vocabulary import Status, is_advice
from .evidence import RENDERED_HERE, evidence_blocks
from .scale import (
    K_SLOWEST,
    MAX_CULPRITS,
    SMALL_JOB,
    compact_ranks,
    gpu_hours_per_day,
    hours_text,
    percentile,
    pick_ranks,
)
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
svg.chart{max-width:100%;height:auto}.scroll{max-width:100%;overflow-x:auto}
.card dd,.card code,.card p{overflow-wrap:anywhere}.card.shape{border-left-color:#1f77b4}
.badge.advice{background:#e1ecf7;color:#1f4f7f}tr.others th,tr.others td{color:#666;font-style:italic}
"""


def _fmt_time(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + " UTC"


def _culprits(incidents: list[dict]) -> set[int]:
    return {r for inc in incidents for r in inc.get("ranks", [])}


def job_ranks(data: dict) -> int:
    """The job's rank count: ``data["world"]`` where given, else the ranks its rows name."""
    if data.get("world"):
        return int(data["world"])
    return max((len({r["rank"] for r in data.get(key) or []})
                for key in ("step_times", "slowdown", "late_arrivals")), default=0)


def split_advice(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(incidents, advice): advice is the job's shape seen from its start, never an incident."""
    return [r for r in rows if not is_advice(r)], [r for r in rows if is_advice(r)]


def cost_text(inc: dict, ranks: int) -> str:
    """``≈ 32.2 GPU-hours per day`` ('' where the step time or the rank count is unknown)."""
    hours = gpu_hours_per_day(float(inc.get("impact_ms_per_step") or 0.0), float(inc.get("step_time_ms") or 0.0),
                              ranks)
    return f"≈ {hours_text(hours)} GPU-hours per day" if hours is not None else ""


def cost_formula(ranks: int) -> str:
    return ('<p class="note cost-formula">Cost in GPU-hours per day = impact (ms per step) ÷ step time (ms) × '
            f'ranks in the job ({ranks:,}) × 24 h: the GPU time the whole job loses in a day while the cause '
            'lasts, since every rank waits for the slowest.</p>')


def render_verdict(incidents: list[dict], advice_rows: list[dict] | None = None, ranks: int = 0) -> str:
    shape = (f" {len(advice_rows)} piece{'s' if len(advice_rows) > 1 else ''} of advice about the job's shape "
             "below (no fault).") if advice_rows else ""
    if not incidents:
        return ('<p class="verdict ok" id="verdict">No anomaly found: the ranks behave like their peers.'
                f'{escape(shape)}</p>')
    top = incidents[0]
    more = f" (and {len(incidents) - 1} more)" if len(incidents) > 1 else ""
    cost = cost_text(top, ranks)
    return (f'<p class="verdict bad" id="verdict">{escape(cause_title(top.get("cause", "")))} on '
            f'{escape(who(top.get("ranks", []), known_hosts(top)))}, function '
            f'<code>{escape(str(top.get("function", "")))}</code>, costing '
            f'{top.get("impact_ms_per_step", 0.0):.1f} ms per step{f" ({escape(cost)})" if cost else ""}'
            f'{escape(more)}.{escape(shape)}</p>')


def render_chart(data: dict) -> str:
    steps = data.get("step_times", [])
    series: dict[int, list[tuple[float, float]]] = {}
    for r in steps:
        series.setdefault(r["rank"], []).append((r["t"], r["step_time_ms"]))
    markers = list(data.get("markers", []))
    incidents, _ = split_advice(data.get("incidents", []))
    markers += [m for inc in incidents if (m := _detection_marker(inc))]
    t0 = min([r["t"] for r in steps] + [m["t"] for m in markers if m.get("t")], default=0.0)
    chart = step_time_chart(series, markers, _culprits(incidents), t0)
    if not series:
        return chart
    named_culprits = len(_culprits(incidents) & set(series))
    every = len(series) <= SMALL_JOB or (named_culprits <= MAX_CULPRITS and len(series) - named_culprits <= K_SLOWEST)
    lines = "every rank" if every else f"the culprits and the {K_SLOWEST} ranks slowest against the median"
    return chart + (f'<p class="note">Bands: the median (p50), p90 and p99 step time across the job\'s '
                    f'{len(series):,} ranks in each window; lines: {lines}, the only ranks named in the '
                    'legend.</p>')


def _detection_marker(inc: dict) -> dict | None:
    """At the end of the window that opened the incident (``detected_s``), which is after the
    onset; an incident without it (an older store) is marked where it was first seen, and says so."""
    title = cause_title(str(inc.get("cause", "")))
    if inc.get("detected_s"):
        return {"t": inc["detected_s"], "kind": "detected", "label": f"detected: {title}"}
    if inc.get("first_seen_s"):
        return {"t": inc["first_seen_s"], "kind": "first-seen", "label": f"first seen: {title}"}
    return None


MAX_FUNCTIONS = 10  # heatmap columns: the functions where the shown ranks differ most from their peers


def _rank_label(rank: int, culprits: set[int]) -> str:
    return f"rank {rank}" + (" (culprit)" if rank in culprits else "")


def _shown(scores: dict[int, float], culprits: set[int]) -> tuple[list[int], list[int], str]:
    """(ranks shown in rank order, the other ranks, a note saying which are shown)."""
    named_culprits, slowest, unnamed = pick_ranks(scores, culprits, K_SLOWEST)
    shown = sorted(named_culprits + slowest)
    others = sorted(set(scores) - set(shown))
    more = f" ({unnamed:,} more culprits not shown)" if unnamed else ""
    return shown, others, more


def render_heatmap(rows: list[dict], culprits: set[int] | None = None) -> str:
    """Rank × function slowdown for the culprits and the ``K_SLOWEST`` ranks furthest above
    their peers outside collectives, then one row with the median of all other ranks."""
    if not rows:
        return '<p class="empty">No per-function statistics stored for this job.</p>'
    culprits = set(culprits or ())
    cell = {(r["rank"], r["function"]): r for r in rows}
    compute = [r for r in rows if not r["function"].startswith("comm:")] or rows
    scores: dict[int, float] = {r["rank"]: 0.0 for r in rows}
    for row in compute:
        scores[row["rank"]] = max(scores[row["rank"]], row["slowdown"])
    shown, others, more = _shown(scores, culprits)
    functions = sorted({r["function"] for r in rows})
    left_out = ""
    if len(functions) > MAX_FUNCTIONS:
        spread = {f: max((abs(cell[(rk, f)]["slowdown"] - 1) for rk in shown if (rk, f) in cell), default=0.0)
                  for f in functions}
        keep = set(sorted(functions, key=lambda f: (-spread[f], f))[:MAX_FUNCTIONS])
        left_out = (f" The {MAX_FUNCTIONS} functions where these ranks differ most from their peers are shown; "
                    f"{len(functions) - MAX_FUNCTIONS} more are left out.")
        functions = [f for f in functions if f in keep]
    head = "".join(f'<th class="fn" title="{escape(f)}">{escape(".".join(f.split(".")[-2:])[:40])}</th>'
                   for f in functions)
    body = []
    for rank in shown:
        tds = []
        for f in functions:
            r = cell.get((rank, f))
            if r is None:
                tds.append("<td></td>")
                continue
            tip = f"rank {rank} {f}: {r['ms_per_step']:.2f} ms/step, peer median {r['peer_median_ms']:.2f} ms"
            tds.append(f'<td style="background:{slowdown_color(r["slowdown"])}" title="{escape(tip)}">'
                       f'{r["slowdown"]:.2f}×</td>')
        body.append(f"<tr><th>{_rank_label(rank, culprits)}</th>{''.join(tds)}</tr>")
    if others:
        tds = []
        for f in functions:
            vals = [cell[(rk, f)]["slowdown"] for rk in others if (rk, f) in cell]
            median = percentile(vals, 0.5) if vals else None
            tds.append(f'<td style="background:{slowdown_color(median)}">{median:.2f}×</td>'
                       if median is not None else "<td></td>")
        body.append(f'<tr class="others"><th>other {len(others):,} ranks (median)</th>{"".join(tds)}</tr>')
    which = (f"Rows: the culprits and the {K_SLOWEST} ranks furthest above their peers outside collectives, "
             f"of {len(scores):,}{more}; the last row is the median of the others. ") if others else ""
    return (f'<div class="scroll"><table class="grid heatmap"><tr><th>rank \\ function</th>{head}</tr>'
            f'{"".join(body)}</table></div>'
            f'<p class="note">{escape(which)}Time per step against the median rank (1.00× = like its peers). A red '
            'collective on most ranks means they <em>wait</em> there: see who arrives last below.'
            f'{escape(left_out)}</p>')


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
    """Collective × rank: the culprits and the ``K_SLOWEST`` ranks that arrived last most
    often, then one column with the highest share among all other ranks."""
    if not rows:
        return '<p class="empty">No collectives compared for this job.</p>'
    incidents = incidents or []
    culprits = _culprits(incidents)
    functions = sorted({r["function"] for r in rows})
    cell = {(r["function"], r["rank"]): r for r in rows}
    told = incident_waits(incidents)
    scores: dict[int, float] = {r["rank"]: 0.0 for r in rows}
    for row in rows:
        if row["collectives"]:
            scores[row["rank"]] = max(scores[row["rank"]], row["late_arrivals"] / row["collectives"])
    shown, others, more = _shown(scores, culprits)
    head = "".join(f"<th>{_rank_label(r, culprits)}</th>" for r in shown)
    if others:
        head += f'<th class="others">other {len(others):,} ranks (highest)</th>'
    body = []
    for f in functions:
        tds = []
        for rank in shown:
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
        if others:
            shares = [(c["late_arrivals"] / c["collectives"], rk) for rk in others
                      if (c := cell.get((f, rk))) and c["collectives"]]
            top = max(shares, default=None)
            tds.append(f'<td class="others" style="background:{share_color(top[0])}" title="rank {top[1]}">'
                       f'{top[0]:.0%}</td>' if top else "<td></td>")
        body.append(f'<tr><th class="fn" title="{escape(f)}">{escape(f)}</th>{"".join(tds)}</tr>')
    which = (f"Columns: the culprits and the {K_SLOWEST} ranks that arrived last most often, of {len(scores):,}"
             f"{more}; the last column is the highest share among the others. ") if others else ""
    return (f'<div class="scroll"><table class="grid late"><tr><th>collective \\ rank</th>{head}</tr>'
            f'{"".join(body)}</table></div>'
            f'<p class="note">{escape(which)}Share of the calls in which the rank arrived last (the one the others '
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


def card_facts(inc: dict[str, Any], ranks: int = 0) -> list[tuple[str, str]]:
    """The card's facts and evidence lines, each once; unknown or empty ones left out. ``ranks``:
    the job's rank count, for the cost in GPU-hours per day."""
    step_ms = inc.get("step_time_ms") or 0.0
    share = f" ({inc['impact_ms_per_step'] / step_ms:.0%} of the {step_ms:.1f} ms step)" if step_ms else ""
    gpus = [str(g) for g in inc.get("gpus") or [] if isinstance(g, int) and g >= 0]
    hosts = known_hosts(inc)
    cost = cost_text(inc, ranks)
    if cost:
        cost += (f" ({inc['impact_ms_per_step']:.1f} ms ÷ {step_ms:.1f} ms × {ranks:,} ranks × 24 h)")
    host_text = ", ".join(hosts[:12]) + (f" … ({len(hosts):,} hosts)" if len(hosts) > 12 else "")
    facts = [("ranks", compact_ranks(inc.get("ranks", [])) or "all"), ("hosts", host_text),
             ("GPUs", ", ".join(gpus)), ("function", str(inc.get("function", ""))), ("kind", str(inc.get("kind", ""))),
             ("impact", f"{inc['impact_ms_per_step']:.1f} ms per step{share}"), ("cost", cost),
             ("score", f"{inc['score']:.1f}"), ("first seen", _fmt_time(inc.get("first_seen_s"))),
             ("last seen", _fmt_time(inc.get("last_seen_s"))), ("windows", str(inc.get("windows") or ""))]
    facts = [(k, v) for k, v in facts if v not in ("", "-")]
    ev = inc.get("evidence")
    if isinstance(ev, dict):
        ev = {k: v for k, v in ev.items() if k not in RENDERED_HERE and k not in FACT_KEYS and _known(v)}
    return facts + evidence_lines(ev)


def render_card(inc: dict[str, Any], ranks: int = 0) -> str:
    """An incident's card, or an advice card (``kind`` "advice": the job's shape, no fault)."""
    status = str(inc.get("status", Status.OPEN.value))
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in card_facts(inc, ranks))
    shape = is_advice(inc)
    cls = "shape" if shape else f'incident {"resolved" if status == Status.RESOLVED else ""}'
    badge = '<span class="badge advice">advice · no fault</span>' if shape else \
        f'<span class="badge {status.lower()}">{escape(status_text(inc))}</span>'
    return (f'<div class="card {cls}" '
            f'data-cause="{escape(str(inc.get("cause", "")))}" data-ranks="{escape(",".join(map(str, inc.get("ranks", []))))}">'
            f'<h3>{escape(cause_title(str(inc.get("cause", ""))))} — {escape(who(inc.get("ranks", []), known_hosts(inc)))}'
            f'{badge}</h3>'
            f'<p class="summary">{escape(str(inc.get("summary", "")))}</p>'
            f'<p class="why">{escape(explain(inc))}</p>{_advice_line(inc)}{_remediation_lines(inc)}'
            f'{evidence_blocks(inc.get("evidence"))}'
            f'<dl>{dl}</dl></div>')


def status_text(inc: dict[str, Any]) -> str:
    """The badge: the status, and for a resolved incident why it ended ("RESOLVED · job finished")."""
    status = str(inc.get("status", Status.OPEN.value))
    reason = str(inc.get("resolved_reason") or "")
    return f"{status} · {reason}" if status == Status.RESOLVED and reason else status


def _remediation_lines(inc: dict[str, Any]) -> str:
    """What the remediation hook did about the incident's node (drained, dry run, refused, failed)."""
    return "".join(f'<p class="remediation">{escape(remediation_text(a))}</p>'
                   for a in inc.get("remediation") or [] if isinstance(a, dict))


def _advice_line(inc: dict[str, Any]) -> str:
    text = advice(str(inc.get("cause", "")))
    return f'<p class="advice">What to check: {escape(text)}</p>' if text else ""


def render_html(data: dict) -> str:
    """The whole page for one job from plain report data."""
    incidents, advice_rows = split_advice(data.get("incidents", []))
    ranks = job_ranks(data)
    cards = "".join(render_card(i, ranks) for i in incidents) or \
        '<p class="empty">No root cause was reported for this job.</p>'
    formula = cost_formula(ranks) if incidents and ranks else ""
    shape = "" if not advice_rows else (
        '<section id="advice"><h2>Advice (no fault)</h2><p class="note">How the job is built, seen from its '
        'first windows: no fault happened and nothing was paged; worth fixing when convenient, since every '
        f'step pays for it.</p><div class="cards">{"".join(render_card(i, ranks) for i in advice_rows)}</div>'
        f'{cost_formula(ranks) if ranks and not incidents else ""}</section>')
    missing = "".join(f'<p class="missing">Not available: {escape(m)}</p>' for m in data.get("missing", []))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(data.get("title", "perftracker report"))}</title><style>{CSS}</style></head>
<body><header><h1>{escape(data.get("title", "perftracker report"))}</h1>
<div class="meta">job <b>{escape(str(data.get("job", "")))}</b> · generated {_fmt_time(data.get("generated_s"))}</div></header>
<main>{missing}<section id="summary"><h2>Diagnosis</h2>{render_verdict(incidents, advice_rows, ranks)}</section>
<section id="incidents"><h2>Root causes, most costly first</h2><div class="cards">{cards}</div>{formula}</section>
{shape}<section id="step-times"><h2>Step time across ranks</h2>{render_chart(data)}</section>
<section id="heatmap"><h2>Slowdown against peers: rank × function</h2>{render_heatmap(data.get("slowdown", []), _culprits(incidents))}</section>
<section id="late-arrivals"><h2>Collective late arrivals</h2>{render_late_arrivals(data.get("late_arrivals", []), incidents)}</section>
</main></body></html>
"""
