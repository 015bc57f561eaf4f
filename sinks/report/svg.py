"""Inline SVG and colour helpers for the report (pure string building, no I/O)."""

from __future__ import annotations

import math
from html import escape

from .scale import K_SLOWEST, percentile, pick_ranks

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
CULPRIT_COLOR = "#d62728"

W, H = 900, 320
LEFT, RIGHT, TOP, BOTTOM = 60, 180, 20, 40
P50_COLOR, BAND_INNER, BAND_OUTER, MARKER_COLOR = "#34495e", "#b9c9db", "#e3eaf2", "#ff7f0e"
MAX_BUCKETS = 150  # time buckets of the percentile bands when windows are not aligned across ranks
LEGEND_ROWS = (H - TOP - BOTTOM - 4) // 16  # 16 px a row in the plot's height: never past the chart
MARKER_ROWS, MARKER_CHAR_W = 4, 7.6  # staggered marker labels; a 12 px bold character's width, generously


def nice_max(value: float) -> float:
    """Smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (axis top)."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 < value:
        scale *= 10
    while scale > value:
        scale /= 10
    for m in (1, 2, 2.5, 5, 10):
        if m * scale >= value:
            return m * scale
    return 10 * scale


def slowdown_color(ratio: float) -> str:
    """White at 1.0 (like the peers), red as a rank needs more time, blue as it needs less."""
    if ratio <= 0:
        return "#f4f4f4"
    if ratio >= 1:
        k = min((ratio - 1) / 1.0, 1.0)  # 2x peers and above: full red
        return f"rgb(255,{int(255 - 190 * k)},{int(255 - 190 * k)})"
    k = min((1 - ratio) / 0.5, 1.0)
    return f"rgb({int(255 - 150 * k)},{int(255 - 90 * k)},255)"


def share_color(share: float) -> str:
    k = max(0.0, min(share, 1.0))
    return f"rgb(255,{int(255 - 170 * k)},{int(255 - 220 * k)})"


def _buckets(series: dict[int, list[tuple[float, float]]]) -> tuple[dict[float, list[float]], dict[float, float]]:
    """(time bucket -> every rank's step times in it, time -> its bucket): one bucket per window
    start, or ``MAX_BUCKETS`` equal spans when the windows are not aligned across ranks."""
    times = sorted({t for pts in series.values() for t, _ in pts})
    key = {t: t for t in times}
    if len(times) > MAX_BUCKETS:
        width = (times[-1] - times[0]) / MAX_BUCKETS or 1.0
        key = {t: times[0] + (min(int((t - times[0]) / width), MAX_BUCKETS - 1) + 0.5) * width for t in times}
    out: dict[float, list[float]] = {}
    for pts in series.values():
        for t, v in pts:
            out.setdefault(key[t], []).append(v)
    return dict(sorted(out.items())), key


def _excess(pts: list[tuple[float, float]], p50_at: dict[float, float], key: dict[float, float]) -> float:
    """A rank's mean step time above the median rank of each bucket (its "slowest" score)."""
    return sum(v - p50_at[key[t]] for t, v in pts) / len(pts) if pts else 0.0


def step_time_chart(series: dict[int, list[tuple[float, float]]], markers: list[dict],
                    culprits: set[int], t0: float, k: int = K_SLOWEST) -> str:
    """Step time across ranks at any rank count: the p50 line and the p50-p90 and p90-p99 bands
    per time bucket, the culprits and the ``k`` slowest other ranks as lines (the only ones in
    the legend), and vertical lines at markers ``{"t", "label", "kind"}``."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return '<p class="empty">No step times stored for this job.</p>'
    buckets, key = _buckets(series)
    bands = [(t, percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99)) for t, v in buckets.items()]
    p50_at = {t: p50 for t, p50, _, _ in bands}
    scores = {rank: _excess(pts, p50_at, key) for rank, pts in series.items()}
    named_culprits, slowest, unnamed = pick_ranks(scores, culprits, k)
    named = named_culprits + slowest
    t_max = max([max(p[0] for p in points), *(m["t"] for m in markers if m.get("t"))]) - t0
    x_span = max(t_max, 1.0)
    named_values = [v for r in named for _, v in series[r]]
    y_bot, y_top, y_step = y_range(min([b[1] for b in bands] + named_values),
                                   max([b[3] for b in bands] + named_values))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / x_span * pw

    def y(v: float) -> float:
        return TOP + ph - (v - y_bot) / (y_top - y_bot) * ph

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="step time across {len(series):,} ranks">']
    parts += _axes(y_bot, y_top, y_step, x_span, pw, ph)
    for lo, hi, cls, fill in ((1, 2, "band-p50-p90", BAND_INNER), (2, 3, "band-p90-p99", BAND_OUTER)):
        upper = " ".join(f"{x(b[0]):.1f},{y(b[hi]):.1f}" for b in bands)
        lower = " ".join(f"{x(b[0]):.1f},{y(b[lo]):.1f}" for b in reversed(bands))
        parts.append(f'<polygon class="band {cls}" fill="{fill}" stroke="{fill}" stroke-width="1" '
                     f'points="{upper} {lower}"/>')
    p50 = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v, _, _ in bands)
    parts.append(f'<polyline class="p50-line" fill="none" stroke="{P50_COLOR}" stroke-width="2" '
                 f'stroke-dasharray="6,3" points="{p50}"><title>median rank (p50)</title></polyline>')
    legend: list[tuple[str, str]] = [
        (f'<line x1="0" y1="-4" x2="20" y2="-4" stroke="{P50_COLOR}" stroke-width="2" stroke-dasharray="6,3"/>',
         "p50 (median rank)"),
        (f'<rect x="0" y="-9" width="20" height="10" fill="{BAND_INNER}"/>', "p50-p90 of ranks"),
        (f'<rect x="0" y="-9" width="20" height="10" fill="{BAND_OUTER}"/>', "p90-p99 of ranks")]
    for i, rank in enumerate(sorted(named, key=lambda r: (r not in culprits, -scores[r], r))):
        culprit = rank in culprits
        color = CULPRIT_COLOR if culprit else PALETTE[i % len(PALETTE)]
        width = 3 if culprit else 1.5
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in series[rank])
        parts.append(f'<polyline class="rank-line" data-rank="{rank}" fill="none" stroke="{color}" '
                     f'stroke-width="{width}" points="{path}"><title>rank {rank}'
                     f'{" (culprit)" if culprit else ""}</title></polyline>')
        legend.append((f'<line x1="0" y1="-4" x2="20" y2="-4" stroke="{color}" stroke-width="{width}"/>',
                       f"rank {rank}{' (culprit)' if culprit else ''}"))
    if unnamed:
        legend.append(("", f"+{unnamed:,} more culprits"))
    for i, (swatch, text) in enumerate(legend[:LEGEND_ROWS]):
        parts.append(f'<g class="legend-entry" transform="translate({W - RIGHT + 12},{TOP + 14 + 16 * i})">'
                     f'{swatch}<text x="26" y="0">{escape(text)}</text></g>')
    parts += _marker_parts(markers, x, pw, ph)
    parts.append("</svg>")
    return "".join(parts)


def _marker_parts(markers: list[dict], x, pw: float, ph: float) -> list[str]:
    """A dashed vertical line per marker; its label beside it on the side with room, one row per
    marker (staggered), cut with an ellipsis where neither side has room (the whole label is
    the line's tooltip)."""
    out = []
    shown = sorted((m for m in markers if m.get("t")), key=lambda m: (m.get("kind") != "fault", m["t"]))
    for i, m in enumerate(shown):
        mx = x(m["t"])
        label = str(m.get("label", ""))
        color = CULPRIT_COLOR if m.get("kind") == "fault" else MARKER_COLOR
        out.append(f'<line class="marker marker-{escape(m.get("kind", "note"))}" x1="{mx:.1f}" '
                   f'y1="{TOP}" x2="{mx:.1f}" y2="{TOP + ph}" stroke="{color}" stroke-dasharray="5,4" '
                   f'stroke-width="2"><title>{escape(label)}</title></line>')
        if i >= MARKER_ROWS:
            continue
        right, left = LEFT + pw - (mx + 4), (mx - 4) - LEFT
        room = max(right, left)
        fits = int(room / MARKER_CHAR_W)
        text = label if len(label) <= fits else label[:max(fits - 1, 0)] + "…"
        anchor, tx = ("start", mx + 4) if right >= len(text) * MARKER_CHAR_W or right >= left else ("end", mx - 4)
        out.append(f'<text x="{tx:.1f}" y="{TOP + 13 + 15 * i}" text-anchor="{anchor}" fill="{color}" '
                   f'class="marker-label">{escape(text)}<title>{escape(label)}</title></text>')
    return out


def y_range(low: float, high: float) -> tuple[float, float, float]:
    """(bottom, top, tick step) of a value axis around [low, high]: at 0 unless the values sit far
    above it (a 180 ms step whose ranks differ by 4 ms would draw flat from 0), then at a round
    number below them, so the spread across ranks stays visible."""
    low, high = max(low * 0.95, 0.0), max(high * 1.05, low * 0.95 + 1e-9)
    step = nice_max((high - (0.0 if low < 0.5 * high else low)) / 5)
    bottom = 0.0 if low < 0.5 * high else math.floor(low / step) * step
    top = bottom + step * max(math.ceil((high - bottom) / step - 1e-9), 1)
    return bottom, top, step


def _axes(y_bot: float, y_top: float, y_step: float, x_span: float, pw: float, ph: float) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    ticks = round((y_top - y_bot) / y_step)
    for i in range(ticks + 1):
        v = round(y_bot + y_step * i, 6)
        yy = TOP + ph - ph * i / ticks
        out.append(f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{LEFT + pw}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{v:g}</text>')
    step = nice_max(x_span / 8)
    t = 0.0
    while t <= x_span + 1e-9:
        xx = LEFT + t / x_span * pw
        out.append(f'<text x="{xx:.1f}" y="{TOP + ph + 16}" text-anchor="middle">{t:g}</text>')
        t += step
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle">seconds since the first '
               f'window</text><text x="14" y="{TOP + ph / 2}" transform="rotate(-90 14 {TOP + ph / 2})" '
               f'text-anchor="middle">step time (ms)</text>')
    return out
