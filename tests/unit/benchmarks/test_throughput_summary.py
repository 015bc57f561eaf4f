"""The throughput benchmark's arithmetic and its offline stages at a tiny size (no broker)."""

from __future__ import annotations

from perftracker_ml.deploy.workloads.batches import Workload

from benchmarks.throughput import Job, encode_job, faust_rates, offline_stages, rate, summary


def _job() -> Job:
    return Job(keys=[b"k"] * 10, values=[b"x" * 100] * 10, events=1000, ranks=5)


def test_rates_come_from_the_best_runs_seconds() -> None:
    out = summary(_job(), e2e=(0.5, 0.4), decode=(0.1, 0.1), summarize=(0.25, 0.2), emit=(0.01, 50),
                  consume_s=0.02, emitted=50)
    assert out["events_per_s"] == 2000 and out["batches_per_s"] == 20
    assert out["decode_events_per_s"] == 10_000 and out["summarize_events_per_s"] == 4000
    assert out["emit_records_per_s"] == 5000 and out["consume_events_per_s"] == 50_000
    assert out["cpu_events_per_s"] == 2500 and out["events_per_batch"] == 100.0 and out["bytes_per_batch"] == 100
    assert out["ranks"] == 5


def test_nothing_timed_is_a_zero_rate_not_an_error() -> None:
    assert rate(10, 0.0) == 0.0


def test_faust_rate_counts_only_the_batches_it_timed() -> None:
    out = faust_rates(_job(), {"batches": 5, "seconds": 2.0, "cpu_s": 1.0, "drained_s": 4.0})
    assert out["faust_events_per_s"] == 250 and out["faust_cpu_events_per_s"] == 500
    assert out["faust_drained_events_per_s"] == 125  # the same events over the span to the downstream drain


def test_offline_stages_smoke() -> None:
    job = encode_job(Workload(ranks=32, seconds=2, tp=4, pp=2), 1_700_000_000_000_000_000)
    stages = offline_stages(job, 1)
    assert job.batches == 64 and job.events > 64 * 50
    assert all(stages[k][0] > 0 for k in ("decode", "summarize", "emit")) and stages["emit"][1] > 0
