"""`perftracker launch -- torchrun --nproc-per-node 4` on an unmodified gloo DDP script."""

from __future__ import annotations

import pytest

from .helpers import by_rank, comm_rows, consume_events, launch_profiled, span_names

pytestmark = pytest.mark.e2e

STEPS = 100  # ~2 s of training: a profile requested before the start is summarized while it runs, not only at exit
PROFILE_STEP = 15


@pytest.fixture(scope="module")
def run_records(kafka_broker, tmp_path_factory):
    prefix = "e2e" + tmp_path_factory.mktemp("x").name[-6:].replace("_", "")
    topics, job = launch_profiled(kafka_broker.bootstrap, prefix, "train_ddp.py", 4, STEPS,
                                  "e2e-prof", PROFILE_STEP)
    return by_rank(consume_events(kafka_broker.bootstrap, topics.events, job))


def test_every_rank_reports_identity_and_no_loss(run_records):
    assert sorted(run_records) == [0, 1, 2, 3]
    for rank, records in run_records.items():
        assert all(r["world_size"] == 4 and r["rank"] == rank for r in records)
        seqs = [r["seq"] for r in records]
        assert seqs == list(range(len(seqs))), "batch sequence has gaps"
        assert records[-1]["dropped_events"] == 0


def test_iterations_detected_on_every_rank(run_records):
    for records in run_records.values():
        steps = [s for r in records for s in r["iterations"]["step"]]
        assert steps == list(range(STEPS))
        durs = [d for r in records for d in r["iterations"]["dur_ns"]]
        assert all(d > 0 for d in durs)


def test_builtin_functions_arrive(run_records):
    for records in run_records.values():
        names = span_names(records)
        assert names["torch.utils.data.DataLoader.__next__"] == STEPS
        assert names["torch.optim.sgd.SGD.step"] == STEPS
        assert names["torch.autograd.backward"] == STEPS
        assert names["torch.nn.modules.container.Sequential.forward"] == STEPS


def test_ddp_internal_all_reduce_captured_and_sequences_line_up(run_records):
    per_rank = {rank: comm_rows(records) for rank, records in run_records.items()}
    reference = per_rank[0]
    all_reduces = [row for row in reference if row[0] == "all_reduce"]
    assert len(all_reduces) >= STEPS  # one gradient bucket per step at least
    assert all(row[3] > 0 for row in all_reduces)
    for rank, rows in per_rank.items():
        assert sorted(rows, key=lambda r: (r[1], r[2])) == sorted(reference, key=lambda r: (r[1], r[2])), rank
    seqs = sorted(row[2] for row in reference)
    assert seqs == list(range(len(seqs)))


def test_span_steps_match_iterations(run_records):
    records = run_records[0]
    tagged = [s for r in records for s in r["spans"]["step"] if s >= 0]
    assert tagged and max(tagged) == STEPS - 1


def test_control_request_profiles_the_same_window_on_every_rank(run_records):
    for records in run_records.values():
        kernels = [(r["names"][k["name"]], k) for r in records for k in r["kernels"]]
        assert kernels, "no profiling summary arrived"
        assert {k["profile_id"] for _, k in kernels} == {"e2e-prof"}
        addmm = [k for name, k in kernels if name == "aten::addmm"]
        assert addmm and addmm[0]["kind"] == 3 and addmm[0]["count"] >= 3


def test_every_rank_sends_cpu_evidence_and_stack_samples_of_the_script(run_records):
    for records in run_records.values():
        cpu = [s for r in records for s in r.get("cpu", [])]
        assert cpu and all(s["interval_ns"] > 0 for s in cpu)
        assert sum(s["thread_cpu_ns"] for s in cpu if s["thread_cpu_ns"] > 0) > 0
        assert sum(s["stack_samples"] for s in cpu) > 0
        frames = {r["names"][f] for r in records
                  for f, k in zip(r["stacks"]["frame"], r["stacks"]["kind"], strict=True) if k == 1}
        assert any("train_ddp.py" in f for f in frames), frames


def test_each_rank_ends_with_one_final_batch(run_records):
    """The exit flush marks the rank's last batch, and only it (EventBatch v4 ``final``)."""
    for records in run_records.values():
        assert [r["final"] for r in records] == [False] * (len(records) - 1) + [True]
