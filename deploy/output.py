"""What the CLI prints: names from user code made inert, and the tables an on-call engineer reads.

Job ids, function names and hosts come from training code and the wire. A
control character or a line break in one could forge or erase lines of our
output (``job\\nrank 0: healthy``, terminal escape sequences), so every printer
passes such values through :func:`printable`, which writes them as Python
escapes (``\\n``, ``\\x1b``, ``\\u2028``). JSON output needs nothing: the
encoder escapes them already.
"""

from __future__ import annotations

import re
from typing import Any

from ..schemas.diagnosis import remediation_text
from ..schemas.vocabulary import is_advice

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the
# bidirectional overrides and isolates (which reorder what a terminal shows)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``value`` as one line of inert text: control characters written as escapes."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def format_diagnosis(job: str, rows: list[dict[str, Any]]) -> str:
    """A table an on-call engineer reads at 3 a.m.: one line per root cause, then its summary."""
    advice = [r for r in rows if is_advice(r)]
    rows = [r for r in rows if not is_advice(r)]
    if not rows and not advice:
        return f"job {printable(job)}: no anomaly found"
    lines = [f"job {printable(job)}: {len(rows)} root cause(s), most costly first" if rows
             else f"job {printable(job)}: no anomaly found"]
    if rows:
        lines.append(f"{'cause':<22}{'ranks':<12}{'hosts':<18}{'function':<34}{'ms/step':>9}{'score':>8}")
    lines += _rows(rows)
    if advice:
        lines.append(f"advice about the job's shape ({len(advice)}; seen from its start, no fault, never paged):")
        lines += _rows(advice)
    return "\n".join(lines)


def _rows(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        ranks = ",".join(str(x) for x in r.get("ranks", []))[:11]
        hosts = printable(",".join(r.get("hosts", [])))[:17]
        lines.append(f"{printable(r['cause']):<22}{ranks:<12}{hosts:<18}{printable(r['function'])[:33]:<34}"
                     f"{r['impact_ms_per_step']:>9.1f}{r['score']:>8.1f}")
        if r.get("summary"):
            lines.append(f"    {printable(r['summary'])}")
        lines += [f"    {printable(remediation_text(a))}" for a in r.get("remediation") or []]
    return lines


def format_status(info: dict[str, Any]) -> list[str]:
    """`perftracker status` as lines (``info`` from ``stack.status``)."""
    if "broker" not in info:
        return [f"perftracker stack is not running (data dir {printable(info['data_dir'])})"]
    lines = [f"running: {info['running']}  data dir: {printable(info['data_dir'])}"]
    b, s = info["broker"], info["sink"]
    lines.append(f"  broker  pid {b['pid']:>7}  {_up(b)}  {b['bootstrap']}")
    lines.append(f"  sink    pid {s['pid']:>7}  {_up(s)}  {s['query_url'] or '-'}")
    for w in info["workers"]:
        assigned = len((w.get("stats") or {}).get("assigned", []))
        lines.append(f"  worker  pid {w['pid']:>7}  {_up(w)}  port {w['port']}, {assigned} partitions")
    if not info["workers"]:
        lines.append("  no worker")
    if not b["alive"]:
        lines.append("the broker has stopped and its topics with it: `perftracker up` explains how to go on")
    elif not info["running"]:
        lines.append("`perftracker up` restarts what is down (the broker and its port are kept)")
    return lines


def _up(proc: dict[str, Any]) -> str:
    return "up  " if proc["alive"] else "DOWN"


def format_job_ranks(ranks: Any) -> list[str]:
    """`perftracker status --job` as lines (``ranks``: a :class:`.job_status.JobRanks`)."""
    job = printable(ranks.job)
    if ranks.world_size == 0:
        return [f"job {job}: no RankWindow in the store, so its ranks cannot be counted"]
    age = f"newest data {ranks.age_s:.0f} s ago" if ranks.age_s >= 0 else "no event yet"
    lines = [f"job {job}: {len(ranks.reporting)} of {ranks.world_size} ranks reporting "
             f"(world size from the job's RankWindows; {age})"]
    if not ranks.missing:
        return lines
    lines.append(f"missing: {_ranges(ranks.missing)}")
    if ranks.never_seen:
        lines.append(f"  never reported: {_ranges(ranks.never_seen)} (no collector attached? "
                     "is perftracker-ml installed in the Python those ranks run, and did their "
                     "launcher pass the environment on?)")
    for s in ranks.silent:
        when = "no event at all" if s.behind_s < 0 else f"last event {s.behind_s:.0f} s before the job's newest"
        lines.append(f"  rank {s.rank:<5} host {printable(s.host)}: {when} (more than {ranks.recent_s:.0f} s)")
    return lines


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
