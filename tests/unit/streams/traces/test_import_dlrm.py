"""The real 8-rank DLRM step: what the raw events show, and what the import must diagnose.

The derivation is written down in docs/trace-import.md; the first tests pin the raw facts
(computed without the detection core), the last ones the diagnosis through the core.
"""

from __future__ import annotations

import json
import statistics

import pytest
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.traces import facts
from perftracker_ml.streams.traces.importer import import_traces_with_report, load_batches

from .helpers import dlrm_archive

REQUIRED = ("kind", "cause", "ranks", "hosts", "function", "score", "impact_ms_per_step",
            "first_seen", "last_seen", "evidence", "summary")


@pytest.fixture(scope="module")
def batches() -> dict[int, dict]:
    return load_batches(dlrm_archive(), "dlrm").batches


@pytest.fixture(scope="module")
def imported() -> tuple[list[dict], object]:
    return import_traces_with_report(dlrm_archive(), "dlrm")


def test_victims_have_the_longest_steps_but_wait_in_the_first_all_to_all(batches):
    table = facts.rank_table(batches)
    steps = {r: row["step_us"] for r, row in table.items()}
    assert sorted(steps, key=steps.get)[-2:] == [3, 1]  # 19.3 and 19.9 ms vs 12.5-18.0
    ranks, m = facts.collective_matrix(batches)[("world", "all_to_all")]
    assert m[ranks.index(1), 0] > 7000 and m[ranks.index(3), 0] > 6000  # us waiting in seq 0
    fwd_net = {r: table[r]["## forward ##"] - m[ranks.index(r), 0] for r in ranks}
    assert max(fwd_net.values()) - min(fwd_net.values()) < 2500  # forward minus that wait is ordinary


def test_rank7_arrives_last_at_the_first_four_all_to_alls(batches):
    ranks, m = facts.collective_matrix(batches)[("world", "all_to_all")]
    assert facts.last_arrivers(ranks, m) == [7, 7, 7, 7, 5]
    assert m[ranks.index(7), :4].max() < 11  # us inside: it never waited
    gap = facts.late_gap_us(m)[:4]
    assert 1250 < gap.sum() < 1350  # ~1.3 ms/step if it had come with the next-latest rank


def test_rank7_own_work_is_not_slow(batches):
    table = facts.rank_table(batches)
    for span in ("## forward ##", "## backward ##", "## optimizer ##", "compute_kernel_us"):
        others = statistics.median(table[r][span] for r in table if r != 7)
        assert table[7][span] <= 1.05 * others, span


def test_ranks_4_and_5_have_slow_cpu_side_backward_not_slow_gpu(batches):
    table = facts.rank_table(batches)
    bwd = {r: table[r]["## backward ##"] for r in table}
    peers = statistics.median(bwd[r] for r in bwd if r not in (4, 5))
    assert all(1.17 < bwd[r] / peers < 1.23 for r in (4, 5))  # +0.9 ms, +20 %
    grad = facts.op_total_us(batches, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
    assert all(grad[r] > 1.15 * statistics.median(grad.values()) for r in (4, 5))  # CPU ops ~20 % slower
    kern = {r: table[r]["compute_kernel_us"] for r in table}
    assert all(kern[r] < 1.1 * statistics.median(kern.values()) for r in (4, 5))  # GPU kernels are not
    _, ar = facts.collective_matrix(batches)[("world", "all_reduce")]
    assert facts.last_arrivers([0, 1, 2, 3, 4, 5, 6, 7], ar)[1:] == [5, 4]


def test_import_names_rank7_as_the_late_arriver_of_all_to_all(imported):
    rows, _ = imported
    late = [r for r in rows if r["kind"] == "straggler"]
    assert [r["ranks"] for r in late] == [[7]]
    assert late[0]["function"] == "comm:all_to_all:world"
    assert late[0]["evidence"]["late_seqs"] == 4 and late[0]["evidence"]["late_fraction"] == 0.8


def test_import_names_ranks_4_and_5_backward(imported):
    rows, _ = imported
    bwd = [r for r in rows if r["function"] == "## backward ##"]
    assert sorted(r["ranks"][0] for r in bwd) == [4, 5]
    assert all(r["kind"] == "outlier" and r["score"] > 5 for r in bwd)


def test_import_never_blames_the_victims(imported):
    rows, _ = imported
    blamed = {rank for r in rows for rank in r["ranks"]}
    assert blamed == {4, 5, 7} and not blamed & {1, 3}


def test_rows_have_the_diagnose_json_shape(imported):
    rows, report = imported
    assert rows and report.policy.persist_windows == 1 and report.policy.window_s >= 60
    for r in rows:
        assert set(REQUIRED) <= set(r)
        assert r["first_seen"].startswith("2023-09-07T23:10:01") and r["impact_ms_per_step"] > 0
    assert json.loads(json.dumps(rows)) == rows
    assert [r["impact_ms_per_step"] for r in rows] == sorted((r["impact_ms_per_step"] for r in rows), reverse=True)
    assert not report.skipped_files and not report.skipped_events


def test_stream_default_policy_names_the_late_arriver_by_its_clear_majority():
    rows, _ = import_traces_with_report(dlrm_archive(), "dlrm", DetectionPolicy())
    # 4 of 5 late: p = 0.0011 > late_p_value 1e-4, but a clear majority costing > 3 % of the step
    assert [r["ranks"] for r in rows if r["kind"] == "straggler"] == [[7]]
