"""The corpus of recorded real runs and their truth, and how a replay of one is scored.

``benchmarks/recordings/<set>/<name>.ptrec`` is a recording (``perftracker record``: the
job's input messages as they arrived, :mod:`perftracker_ml.schemas.recording`) and
``<name>.truth.json`` beside it says what a correct diagnosis names (:class:`Truth`),
written by whoever staged the fault (``benchmarks.record_corpus``), never read off a
diagnosis. ``<set>`` is ``tuning`` (rules may be changed until these are right) or
``evaluation`` (frozen: recorded and committed before any rule change, never tuned on).

A replay is scored as the live fault suite scores a live run (:func:`benchmarks.live_faults.score`
over every state of every incident), plus:

* ``false_alarms`` (:func:`benchmarks.live_faults.false_alarms`): incidents (job-wide ones
  included) on a job without a fault, and on a faulty job the incidents naming neither a
  culprit nor the expected job-wide cause;
* ``windows_to_detect``: windows of the detection policy from the fault's onset until the
  replay clock at which the diagnosis was complete (None when it never was).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perftracker_ml.schemas.vocabulary import is_advice

from .live_faults import DEAD, HANG, Expect, false_alarms, score

CORPUS_DIR = Path(__file__).with_name("recordings")
SETS = ("tuning", "evaluation")


@dataclass(frozen=True)
class Truth:
    """What a correct diagnosis of a recorded run says (see the module docstring)."""

    name: str
    set: str  # "tuning" or "evaluation"
    culprits: dict[str, str] = field(default_factory=dict)  # rank -> cause ("hang", "hang:dead")
    job_cause: str | None = None  # a job-wide cause naming no rank
    location: str | None = None  # "file.py:line" an incident naming a culprit must give
    clears: bool = False  # the fault stops while the job runs: its incidents must resolve "cleared"
    onset_ms: int | None = None  # wall time the fault started (None: no fault)
    fault: str = "none"
    layout: str = "ddp"  # ddp, tp-fsdp2, pp, ...
    script: str = ""
    nodes: int = 1
    ranks: int = 4
    how: str = ""  # the command that made the run
    live: dict[str, Any] = field(default_factory=dict)  # what the live stack said then (information only)

    @property
    def expect(self) -> Expect:
        return Expect({int(r): c for r, c in self.culprits.items()}, job_cause=self.job_cause,
                      location=self.location, clears=self.clears)

    @property
    def healthy(self) -> bool:
        return not self.culprits and not self.job_cause

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def load(cls, path: Path) -> Truth:
        return cls(**json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Entry:
    recording: Path
    truth: Truth


def entries(root: Path = CORPUS_DIR, sets: tuple[str, ...] = SETS) -> list[Entry]:
    """Every recording of ``sets`` under ``root`` with its truth, by set then name."""
    from perftracker_ml.schemas.recording import SUFFIX, truth_path

    out = []
    for s in sets:
        for rec in sorted((root / s).glob(f"*{SUFFIX}")):
            out.append(Entry(rec, Truth.load(truth_path(rec))))
    return out


def rows_of(anomalies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anomaly records as the scorer reads diagnosis rows (evidence decoded)."""
    out = []
    for a in anomalies:
        try:
            evidence = json.loads(a.get("evidence_json") or "{}")
        except ValueError:
            evidence = {}
        out.append({**a, "evidence": evidence})
    return out


def score_replay(truth: Truth, anomalies: list[dict[str, Any]], emitted_ms: list[int],
                 window_ms: int) -> dict[str, Any]:
    """One replay against its truth: the live suite's fields, false alarms, windows to detect."""
    rows = rows_of(anomalies)
    detected_ms = None
    if not truth.healthy:
        for i in range(len(rows)):
            if score(truth.expect, rows[:i + 1], truth.location)["detected"]:
                detected_ms = emitted_ms[i]
                break
    result = score(truth.expect, rows, truth.location)
    result.pop("detected")
    windows = None
    if detected_ms is not None and truth.onset_ms is not None:
        windows = max(0, math.ceil((detected_ms - truth.onset_ms) / window_ms))
    last = {r["incident_id"]: r for r in rows}
    return {"name": truth.name, "set": truth.set, **result,
            "detected": detected_ms is not None, "windows_to_detect": windows,
            "seconds_to_detect": (round((detected_ms - truth.onset_ms) / 1000, 1)
                                  if detected_ms is not None and truth.onset_ms is not None else None),
            "found": [{"cause": r["cause"], "ranks": r["ranks"], "status": r["status"],
                       **({"advice": True} if is_advice(r) else {})} for r in last.values()]}


def totals(scored: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one set: shares right, false ranks and alarms, windows to detect."""
    import numpy as np

    def pct(xs: list[bool]) -> float | None:
        return round(100.0 * sum(xs) / len(xs), 1) if xs else None

    located = [s["location_correct"] for s in scored if s["location_correct"] is not None]
    windows = [s["windows_to_detect"] for s in scored if s["windows_to_detect"] is not None]
    return {"recordings": len(scored),
            "culprits_pct": pct([s["culprit_correct"] for s in scored]),
            "causes_pct": pct([s["cause_correct"] for s in scored]),
            "locations_pct": pct(located),
            "false_ranks": sum(len(s["false_ranks"]) for s in scored),
            "false_alarms": sum(s["false_alarms"] for s in scored),
            "p50_windows_to_detect": float(np.percentile(windows, 50)) if windows else None,
            "wrong": [s["name"] for s in scored if not (s["culprit_correct"] and s["cause_correct"]
                                                        and s["location_correct"] is not False
                                                        and s.get("cleared") is not False)]}


BASELINE = CORPUS_DIR / "baseline.json"
VERDICTS = ("culprit_correct", "cause_correct", "location_correct", "cleared", "detected")


def verdict(scored: dict[str, Any]) -> dict[str, Any]:
    """What the baseline keeps of one scored replay: the verdicts, the false ranks and alarms."""
    return {**{k: scored[k] for k in VERDICTS}, "false_ranks": list(scored["false_ranks"]),
            "false_alarms": scored["false_alarms"]}


def worse_than(baseline: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How ``now`` (a :func:`verdict`) is worse than ``baseline``: a verdict that was right and is
    not, a false rank not there before, more false alarms. Empty: no worse."""
    out = [f"{k} was {baseline[k]} and is {now[k]}" for k in VERDICTS if baseline.get(k) is True and now[k] is not True]
    new_ranks = sorted(set(now["false_ranks"]) - set(baseline.get("false_ranks", [])))
    if new_ranks:
        out.append(f"new false ranks {new_ranks}")
    if now["false_alarms"] > baseline.get("false_alarms", 0):
        out.append(f"false alarms {baseline.get('false_alarms', 0)} -> {now['false_alarms']}")
    return out


__all__ = ["BASELINE", "VERDICTS", "verdict", "worse_than", "CORPUS_DIR", "DEAD", "HANG", "Entry", "Truth", "entries", "false_alarms", "score_replay", "totals"]
