"""Run parsed traces of many ranks through the same detection core the stream workers use.

Pipeline (all in process, no Kafka): each trace -> :func:`.kineto.parse_trace` ->
EventBatch dict -> the stream topology's three stages run by its in-process
:class:`~perftracker_ml.streams.topology.LocalRunner` (summarize per rank, compare per
function, diagnose the job) -> Anomaly records -> rows shaped like ``perftracker diagnose --json``.

Offline policy (:func:`import_policy`): a profiler trace covers a few steps, not a stream
of windows, so the whole import is **one window** (its length rounded up to whole
seconds, at least 60 s, and the events re-based so the earliest lands on a window start),
findings need **one** window to persist, and the clocks the core waits on (grace, close
lag) are driven synthetically. Everything else (MAD threshold, excess, cost floors,
late-arriver statistics) is the caller's policy; only the fields named in
:data:`OFFLINE_OVERRIDES` are replaced. Without a caller policy the default is
``DetectionPolicy(**OFFLINE_DEFAULTS)`` (a looser late-arriver p-value, see there). ``first_seen``/``last_seen``
are the real trace times, not the re-based window edges.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from ...schemas.diagnosis import diagnosis_row
from ...schemas.record_sets import expanded
from ...schemas.records import Anomaly
from ...schemas.vocabulary import (
    ANOMALY,
    EVENT_BATCH,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
)
from ..detect import DetectionPolicy
from ..topology import COMPARE, DIAGNOSE, SUMMARIZE, LocalRunner
from .kineto import parse_trace_with_skips
from .load import RawTrace, Skip, TraceError, read_traces

MIN_WINDOW_S = 60
KEPT = frozenset({FUNCTION_PATTERN, RANK_WINDOW, FUNCTION_COMPARISON, ANOMALY})  # what the sink stores
# statistical thresholds used when the caller passes no policy: a one-step trace has a handful
# of calls per collective, so the stream default late_p_value (1e-4) is out of reach unless a
# rank is last in every call (8 members, 5 calls: 4 of 5 late is p = 0.0011); see docs/trace-import.md
OFFLINE_DEFAULTS: dict[str, Any] = {"late_p_value": 0.01}
OFFLINE_OVERRIDES = ("window_s", "window_grace_s", "close_lag_ms", "persist_windows", "clear_windows",
                     "min_step_share", "max_open_windows")


@dataclass
class ImportReport:
    """What an import used and left out (for the CLI's summary line and the tests)."""

    batches: dict[int, dict] = field(default_factory=dict)  # rank -> EventBatch dict
    sources: dict[int, str] = field(default_factory=dict)  # rank -> file
    skipped_files: list[Skip] = field(default_factory=list)
    skipped_events: Counter = field(default_factory=Counter)  # "file: reason" -> count
    core_skipped: Counter = field(default_factory=Counter)
    anomalies: list[Anomaly] = field(default_factory=list)
    policy: DetectionPolicy | None = None
    # every record the stages sent (FunctionPattern, RankWindow, FunctionComparison, Anomaly):
    # what a stream worker would have sent the sink, for keeping the import in the store
    records: list[tuple[str, dict]] = field(default_factory=list)
    window_start_ms: int = 0  # where the import's window was placed (the records' clock)


def batch_span_ns(batch: dict) -> tuple[int, int]:
    """Earliest start and latest end (ns, trace clock) of a batch's spans, comms and steps."""
    starts, ends = [], []
    for cols in (batch["spans"], batch["comms"], batch["iterations"]):
        for s, d in zip(cols["start_ns"], cols["dur_ns"], strict=True):
            starts.append(s)
            ends.append(s + d)
    if not starts:
        return batch["mono_ns"], batch["mono_ns"]
    return min(starts), max(ends)


def import_policy(base: DetectionPolicy | None, span_ns: int) -> DetectionPolicy:
    """``base`` with the offline overrides: one window covering ``span_ns``, persistence 1.

    The window is padded far past the traced steps, so the core's estimate of step time as
    window length / steps means nothing here: its step-share cost floor is switched off and the
    absolute floor (``min_cost_ms_per_step``) applies alone."""
    base = base or DetectionPolicy(**OFFLINE_DEFAULTS)
    window_s = max(MIN_WINDOW_S, math.ceil(span_ns / 1e9) + 1)
    return dataclasses.replace(base, window_s=float(window_s), window_grace_s=1.0, close_lag_ms=0,
                               persist_windows=1, clear_windows=1, min_step_share=0.0, max_open_windows=max(2, base.max_open_windows))


# called after each file: (file, events in it: 0 for a skipped file)
OnTrace = Callable[[str, int], None]


def load_batches(path: Path, job: str, on_trace: OnTrace | None = None) -> ImportReport:
    """Parse every trace under ``path``; bad files are recorded in the report, not raised."""
    report = ImportReport()
    for item in read_traces(path):
        if isinstance(item, Skip):
            report.skipped_files.append(item)
            if on_trace is not None:
                on_trace(item.source, 0)
            continue
        events = len(item.data.get("traceEvents") or ())
        _add_trace(report, item, job)
        if on_trace is not None:
            on_trace(item.source, events)
        del item  # let this trace go before the next one is read (peak memory: one trace at a time)
    if not report.batches:
        why = "; ".join(f"{s.source}: {s.reason}" for s in report.skipped_files[:5]) or "no trace files found"
        raise TraceError(f"{path}: no usable PyTorch profiler trace ({why})")
    return report


def _add_trace(report: ImportReport, item: RawTrace, job: str) -> None:
    try:
        batch, skipped = parse_trace_with_skips(item.data, job, item.source)
    except TraceError as exc:
        report.skipped_files.append(Skip(item.source, str(exc).removeprefix(f"{item.source}: ")))
        return
    rank = batch["rank"]
    if rank in report.batches:
        report.skipped_files.append(Skip(item.source, f"rank {rank} already imported from {report.sources[rank]}"))
        return
    for reason, n in skipped.items():
        report.skipped_events[f"{item.source}: {reason}"] += n
    report.batches[rank] = batch
    report.sources[rank] = item.source


def trace_span_ns(report: ImportReport) -> tuple[int, int]:
    """Earliest start and latest end (ns, trace clock) over every rank's batch."""
    spans = [batch_span_ns(b) for b in report.batches.values()]
    return min(s for s, _ in spans), max(e for _, e in spans)


def run_core(report: ImportReport, job: str, base_policy: DetectionPolicy | None,
             place_at_ms: int | None = None) -> list[Anomaly]:
    """Feed the report's batches through the three stages; Anomaly records, most costly first.

    The window starts where the earliest event falls, floored to a window boundary, or, with
    ``place_at_ms`` (epoch ms), at that time floored to a window boundary: the records then
    carry that clock (for a store that would drop rows as old as the trace). The detection
    does not change with the placement; the diagnosis rows keep the trace's own times."""
    t0, t1 = trace_span_ns(report)
    policy = report.policy = import_policy(base_policy, t1 - t0)
    wms = policy.window_ms
    t0_ms = t0 // 1_000_000
    at_ms = t0_ms if place_at_ms is None else place_at_ms
    report.window_start_ms = at_ms - at_ms % wms
    shift_ns = (report.window_start_ms - t0_ms) * 1_000_000  # earliest event lands on the window start
    now = (t1 + shift_ns) // 1_000_000 + wms + 1  # past the window's end: it closes
    report.records = []

    def keep(name: str, record: Any) -> Any:
        for one_name, one in expanded(name, record):  # a record set's records, each as the sink stores it
            if one_name in KEPT:
                report.records.append((one_name, one))
        return record

    runner = LocalRunner(policy, wire=keep)
    out = []  # a stage evaluates a window once every rank is in: anomalies may leave at any call
    # every rank's batch in one chunk, as the worker's agent folds its input
    out += runner.feed_chunk([(EVENT_BATCH, {**batch, "wall_ns": batch["mono_ns"] + shift_ns})
                              for _rank, batch in sorted(report.batches.items())], now)
    out += runner.poll(SUMMARIZE, now, flush=True)
    later = now + policy.grace_ms + 1
    out += runner.poll(COMPARE, later)
    out += runner.poll(DIAGNOSE, later + 2 * policy.grace_ms + 2000)
    for stage in (SUMMARIZE.name, DIAGNOSE.name):
        for _key, core in runner.cores[stage].items():
            report.core_skipped.update({f"{stage}:{k}": v for k, v in core.skipped.items()})
    report.anomalies = [cast(Anomaly, rec) for name, rec in out if name == ANOMALY]
    return report.anomalies


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat()


def diagnosis_rows(anomalies: list[Anomaly], report: ImportReport) -> list[dict[str, Any]]:
    """Anomaly records -> the ``perftracker diagnose --json`` row shape, most costly first;
    first/last seen are the traces' real times."""
    spans = [batch_span_ns(b) for b in report.batches.values()]
    first, last = _iso(min(s for s, _ in spans)), _iso(max(e for _, e in spans))
    rows = [diagnosis_row(a, first, last) for a in anomalies]
    return sorted(rows, key=lambda r: -r["impact_ms_per_step"])


def import_traces_with_report(path: Path, job: str, policy: DetectionPolicy | None = None,
                              on_trace: OnTrace | None = None) -> tuple[list[dict[str, Any]], ImportReport]:
    """:func:`import_traces` plus the :class:`ImportReport` (skips, batches, policy used, the
    records for the store); ``on_trace``: see :func:`load_batches`."""
    report = load_batches(Path(path), job, on_trace)
    anomalies = run_core(report, job, policy)
    return diagnosis_rows(anomalies, report), report


def import_traces(path: Path, job: str, policy: DetectionPolicy | None = None) -> list[dict[str, Any]]:
    """Diagnosis rows (``perftracker diagnose --json`` shape) for the traces under ``path``.

    Raises :class:`TraceError` (a :class:`PerftrackerError`) when nothing can be imported."""
    return import_traces_with_report(path, job, policy)[0]
