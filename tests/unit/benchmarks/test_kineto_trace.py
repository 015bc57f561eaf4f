"""The import benchmark's generated traces are traces the importer reads, and it finds the slow rank."""

from __future__ import annotations

import json

from perftracker_ml.deploy.workloads.kineto import TraceJob, write_job
from perftracker_ml.streams.traces.importer import import_traces_with_report

from benchmarks.import_speed import summary

JOB = TraceJob(ranks=4, steps=2, layers=4, buckets=2, slow_rank=2)


def test_generated_traces_import_cleanly_and_name_the_slow_rank(tmp_path) -> None:
    paths = write_job(JOB, tmp_path)
    assert len(paths) == JOB.ranks
    first = json.loads(paths[0].read_text())
    assert first["distributedInfo"]["world_size"] == JOB.ranks and first["traceEvents"]
    rows, report = import_traces_with_report(tmp_path, "bench")
    assert sorted(report.batches) == list(range(JOB.ranks))
    assert not report.skipped_files and not report.skipped_events
    for batch in report.batches.values():
        assert batch["iterations"]["step"] == list(range(JOB.steps))
        assert batch["comms"]["seq"] == list(range(JOB.buckets * JOB.steps))  # one world group, in order
        assert batch["groups"][0]["ranks"] == list(range(JOB.ranks))
    assert {r for row in rows for r in row["ranks"]} == {JOB.slow_rank}


def test_import_summary_ratios() -> None:
    out = summary(total_bytes=100_000_000, largest_bytes=10_000_000, import_s=(2.0, 1.0), parse_s=1.0,
                  peak_bytes=25_000_000)
    assert out["mb_per_s"] == 50.0 and out["cpu_mb_per_s"] == 100.0 and out["parse_mb_per_s"] == 100.0
    assert out["peak_mb"] == 25.0 and out["peak_over_largest"] == 2.5 and out["peak_over_total"] == 0.25
