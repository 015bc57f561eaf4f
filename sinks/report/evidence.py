"""The incident card's CPU evidence and code location: where the rank's time goes.

Rank findings carry ``evidence.cpu`` (per rank: the verdict and the rank's and peers'
run-queue wait, context switches, steal, CPU/wall ratio), ``evidence.top_frames`` (the
most sampled user-code frames per rank) and ``evidence.location`` (the frame with the
rank's extra time); a hang carries ``evidence.stacks`` (the culprits' current user frames,
the same shape as ``top_frames``); see docs/detection.md. This module renders them as two small blocks,
and ``evidence.decisions`` (the window's decision trace: which rule named or cleared which rank)
as a third, and leaves the other evidence keys to the generic lines.
"""

from __future__ import annotations

from html import escape
from typing import Any

RENDERED_HERE = frozenset({"cpu", "top_frames", "location", "stacks", "decisions"})
DECISIONS_SHOWN = 8  # decisions a card lists (the named and cleared ranks; `diagnose --explain` has all)
VERDICTS = {"contended": "waited for a CPU more than its peers",
            "not_contended": "no sign of waiting for a CPU more than its peers",
            "unavailable": "CPU evidence unavailable (collector without /proc readings)"}
CPU_ROWS = (("runqueue_wait_ms_per_step", "run-queue wait (ms/step)"),
            ("involuntary_switches_per_step", "involuntary switches / step"),
            ("steal_pct", "CPU steal (%)"), ("cpu_ratio", "thread CPU / wall"))
HOST_ROWS = (("load1", "host load (1 min)"), ("major_faults", "major page faults"))  # the rank's own, no peer figure


def _num(v: Any) -> str:
    return f"{v:,.3g}" if isinstance(v, (int, float)) else escape(str(v))


def _measured(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0


def cpu_block(cpu: Any) -> str:
    """One line per rank: the verdict, then each reading with the peers' median."""
    if not isinstance(cpu, dict) or not cpu:
        return ""
    items = []
    for rank, ev in cpu.items():
        if not isinstance(ev, dict):
            continue
        verdict = VERDICTS.get(str(ev.get("verdict")), str(ev.get("verdict", "")))
        readings = [f"{name} {_num(ev[k])} vs {_num(ev.get('peer_' + k, '-'))} on peers"
                    for k, name in CPU_ROWS if _measured(ev.get(k))]
        readings += [f"{name} {_num(ev[k])}" for k, name in HOST_ROWS if _measured(ev.get(k))]
        items.append(f"<li>rank {escape(str(rank))}: <b>{escape(verdict)}</b>"
                     f"{'; ' + escape('; '.join(readings)) if readings else ''}</li>")
    return f'<div class="cpu-evidence"><h4>CPU evidence</h4><ul>{"".join(items)}</ul></div>' if items else ""


def frames_block(top_frames: Any, location: Any) -> str:
    """The frame with the rank's extra time first, then each rank's most sampled frames."""
    items = []
    if isinstance(location, dict):
        locs = location.values() if "frame" not in location else [location]
        for loc in locs:
            if isinstance(loc, dict) and "frame" in loc:
                items.append(f"<li><b>{_num(loc.get('extra_ms_per_step', 0))} ms/step more than its peers</b> in "
                             f"<code>{escape(str(loc['frame']))}</code></li>")
    if isinstance(top_frames, dict):
        for rank, frames in top_frames.items():
            for fr in frames if isinstance(frames, list) else []:
                if isinstance(fr, dict) and "frame" in fr:
                    items.append(f"<li>rank {escape(str(rank))}: <code>{escape(str(fr['frame']))}</code> "
                                 f"{_num(100 * float(fr.get('share', 0)))}% of samples</li>")
    return f'<div class="stack-tops"><h4>Where the time goes (sampled stacks)</h4><ul>{"".join(items)}</ul></div>' \
        if items else ""


def evidence_blocks(evidence: Any) -> str:
    if not isinstance(evidence, dict):
        return ""
    frames = evidence.get("top_frames") or evidence.get("stacks")
    return frames_block(frames, evidence.get("location")) + cpu_block(evidence.get("cpu")) + \
        decisions_block(evidence.get("decisions"))


def decisions_block(decisions: Any) -> str:
    """Which rule named or cleared which rank, and why (flags left out)."""
    items: list[str] = []
    for d in decisions if isinstance(decisions, list) else []:
        if isinstance(d, dict) and d.get("action") in ("added", "cleared") and len(items) < DECISIONS_SHOWN:
            what = "named" if d["action"] == "added" else "cleared"
            items.append(f"<li>rank {escape(str(d.get('rank')))}: {what} by rule <code>{escape(str(d.get('rule')))}"
                         f"</code>: {escape(str(d.get('reason', '')))}</li>")
    return f'<div class="decisions"><h4>Why these ranks</h4><ul>{"".join(items)}</ul></div>' if items else ""
