"""`perftracker import-traces`: diagnose profiler traces and keep the result in the store.

The detection runs in process (:mod:`perftracker_ml.streams.traces`); what its stages sent,
the records a stream worker would have sent the sink, is then written into the store
(:func:`perftracker_ml.sinks.client.keep`): through the stack's sink when it runs, else into
the store directly (the data dir's embedded chDB by default). `diagnose` and `report`
then read the job like any other.

**When the traces are old.** The store drops rows older than its retention at insert
(``store.retention_days`` for windows, ``store.incident_retention_days`` for incidents), and
traces are often older than that (or stamped on a clock that starts at boot). Such an
import is stored as of the import time, and the command says so; the diagnosis it prints
keeps the traces' own times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..schemas.settings import Settings
from .progress import Progress

if TYPE_CHECKING:
    from ..sinks.keep import Kept
    from ..streams.traces.importer import ImportReport

DAY_MS = 86_400_000


@dataclass
class ImportOutcome:
    rows: list[dict[str, Any]]
    report: ImportReport
    kept: Kept | None = None  # None: nothing stored (--no-store)
    trace_end_ms: int = 0
    stored_at_ms: int | None = None  # the import time, when the traces were too old to keep as they are


def store_time_ms(settings: Settings, trace_end_ms: int, now_ms: int) -> int | None:
    """None to store the import at the traces' own time; ``now_ms`` when the store would drop
    rows that old at once or within a day (``store.retention_days`` minus one day)."""
    keep_days = max(0, min(settings.store.retention_days, settings.store.incident_retention_days) - 1)
    return now_ms if trace_end_ms < now_ms - keep_days * DAY_MS else None


def run_import(settings: Settings, path: Path, job: str, progress: Progress, store: bool = True) -> ImportOutcome:
    """Parse, diagnose and (``store``) keep the traces under ``path`` as ``job``."""
    from ..streams.traces.importer import diagnosis_rows, load_batches, run_core, trace_span_ns

    progress.phase("parsing traces")
    report = load_batches(Path(path), job, progress.trace_read)
    end_ms = trace_span_ns(report)[1] // 1_000_000
    place = store_time_ms(settings, end_ms, int(time.time() * 1000)) if store else None
    progress.phase(f"detecting over {len(report.batches)} rank(s)")
    rows = diagnosis_rows(run_core(report, job, None, place), report)
    outcome = ImportOutcome(rows, report, trace_end_ms=end_ms, stored_at_ms=place)
    if store:
        from ..sinks.client import keep

        progress.phase(f"storing {len(report.records)} records")
        outcome.kept = keep(settings, report.records)
    return outcome


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def stored_lines(outcome: ImportOutcome, settings: Settings, job: str) -> list[str]:
    """What the command says about the store (after the diagnosis)."""
    kept = outcome.kept
    if kept is None:
        return ["not stored (--no-store)"]
    lines = [f"stored in {kept.where}: {kept.rows_written} row(s) from {kept.records} record(s); "
             f"`perftracker diagnose --job {job}` and `perftracker report --job {job} --out FILE` read it"]
    if outcome.stored_at_ms is not None:
        lines.append(f"the traces end {utc(outcome.trace_end_ms)}, older than the store keeps "
                     f"(store.retention_days = {settings.store.retention_days}): stored as of the import "
                     f"time, {utc(outcome.stored_at_ms)}")
    left_out = len(kept.invalid)
    if left_out:
        lines.append(f"{left_out} record(s)/row(s) left out, first: {kept.invalid[0]}")
    return lines
