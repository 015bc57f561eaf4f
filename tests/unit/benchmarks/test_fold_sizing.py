"""``benchmarks.fold_sizing`` times the real folds on the same batches: the chunk fold folds every
batch column-wise, each rank's first included (the states' equality is test_chunk_fold.py's)."""

from __future__ import annotations

import json

from benchmarks.fold_sizing import main


def test_the_benchmark_times_both_folds_and_folds_the_chunks_column_wise(capsys):
    assert main(["--ranks", "32", "--seconds", "3", "--chunk", "50", "--repeat", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batches"] == 96 and out["events"] > 96 * 50
    assert out["sequential_batches"] == 0  # each rank's first batch too: its first data fixes its first window
    assert out["event_fold_us_per_event"] > 0 and out["chunk_fold_us_per_event"] > 0
