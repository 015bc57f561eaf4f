"""Inline SVG and colour helpers for the report (pure string building, no I/O)."""

from __future__ import annotations

from html import escape

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
CULPRIT_COLOR = "#d62728"

W, H = 900, 320
LEFT, RIGHT, TOP, BOTTOM = 60, 150, 20, 40


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


def step_time_chart(series: dict[int, list[tuple[float, float]]], markers: list[dict],
                    culprits: set[int], t0: float) -> str:
    """Line per rank: (epoch_s, ms) points; vertical lines at markers ``{"t", "label", "kind"}``."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return '<p class="empty">No step times stored for this job.</p>'
    t_max = max([max(p[0] for p in points), *(m["t"] for m in markers if m.get("t"))]) - t0
    x_span = max(t_max, 1.0)
    y_top = nice_max(max(p[1] for p in points) * 1.1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / x_span * pw

    def y(v: float) -> float:
        return TOP + ph - v / y_top * ph

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'aria-label="step time per rank">']
    parts += _axes(y_top, x_span, pw, ph)
    for i, (rank, pts) in enumerate(sorted(series.items())):
        color = CULPRIT_COLOR if rank in culprits else PALETTE[i % len(PALETTE)]
        width = 3 if rank in culprits else 1.5
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        parts.append(f'<polyline class="rank-line" data-rank="{rank}" fill="none" stroke="{color}" '
                     f'stroke-width="{width}" points="{path}"><title>rank {rank}</title></polyline>')
        ly = TOP + 14 + 16 * i
        parts.append(f'<line x1="{W - RIGHT + 12}" y1="{ly - 4}" x2="{W - RIGHT + 32}" y2="{ly - 4}" '
                     f'stroke="{color}" stroke-width="{width}"/><text x="{W - RIGHT + 38}" y="{ly}">'
                     f'rank {rank}{" (culprit)" if rank in culprits else ""}</text>')
    for m in markers:
        if not m.get("t"):
            continue
        mx = x(m["t"])
        color = CULPRIT_COLOR if m.get("kind") == "fault" else "#ff7f0e"
        parts.append(f'<line class="marker marker-{escape(m.get("kind", "note"))}" x1="{mx:.1f}" '
                     f'y1="{TOP}" x2="{mx:.1f}" y2="{TOP + ph}" stroke="{color}" stroke-dasharray="5,4" '
                     f'stroke-width="2"><title>{escape(m.get("label", ""))}</title></line>'
                     f'<text x="{mx + 4:.1f}" y="{TOP + 12 + (14 if m.get("kind") != "fault" else 0)}" '
                     f'fill="{color}" class="marker-label">{escape(m.get("label", ""))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _axes(y_top: float, x_span: float, pw: float, ph: float) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    for i in range(6):
        v = y_top * i / 5
        yy = TOP + ph - ph * i / 5
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
               f'text-anchor="middle">median step time (ms)</text>')
    return out
