"""The HTA comparison's own logic: trace sets, verdict scoring, the line without HTA."""

from __future__ import annotations

import json

from perftracker_ml.deploy.workloads.kineto import TraceJob, write_job

from benchmarks import vs_hta


def test_scores_perftracker_against_the_built_culprit_and_says_how_to_get_hta(tmp_path, monkeypatch) -> None:
    write_job(TraceJob(ranks=4, steps=2, layers=4, buckets=2, slow_rank=2, first_step=10,
                       nccl_kernel=vs_hta.NCCL_KERNEL_PRE_2_19), tmp_path)
    monkeypatch.setattr(vs_hta, "run_hta", lambda ts: {"error": vs_hta.HTA_MISSING})
    row = vs_hta.compare(vs_hta.TraceSet("slow", tmp_path, frozenset({2}), frozenset({0})))
    assert row["perftracker"]["ranks"] == [2] and row["perftracker_correct"] and not row["perftracker_names_victim"]
    assert "hta_correct" not in row
    totals = vs_hta.totals([row])
    assert totals["perftracker_correct"] == 1 and "pip install holistictraceanalysis" in totals["hta"]
    assert json.loads(json.dumps(totals)) == totals


def test_hta_verdicts_are_scored_top_k_and_top_1(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(vs_hta, "run_ours", lambda ts: {"seconds": 1.0, "findings": [], "ranks": []})
    monkeypatch.setattr(vs_hta, "run_hta", lambda ts: {"stragglers": [0, 2], "top_straggler": 2, "seconds": 9.0})
    late = vs_hta.compare(vs_hta.TraceSet("late", tmp_path, frozenset({2})))
    assert not late["hta_correct"] and late["hta_top1_correct"] and not late["perftracker_correct"]
    noise = vs_hta.compare(vs_hta.TraceSet("none", tmp_path, frozenset()))
    assert noise["perftracker_correct"] and not noise["hta_correct"] and not noise["hta_top1_correct"]


def test_dlrm_is_skipped_without_a_path(tmp_path) -> None:
    assert vs_hta.dlrm_set("", tmp_path) is None
    assert vs_hta.dlrm_set(str(tmp_path / "absent.tar.gz"), tmp_path) is None
