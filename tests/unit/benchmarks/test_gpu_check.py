"""benchmarks.gpu_check without a GPU (what CI can run of it), and its part-b judgement on the
recording it made on an H200."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RECORDING = ROOT / "benchmarks" / "recordings" / "tuning" / "gpu-shared-straggler.ptrec"
ONSET_STEP = 1181  # the step rank 2's spin began at in that run (its onset file)


def test_without_a_gpu_it_says_what_it_skipped_and_exits_0(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the check runs for real")
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--json", "--skip", "a", "--out",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["gpu"] is False and report["status"] == "ok"
    parts = report["parts"]
    assert {k: v["status"] for k, v in parts.items()} == {
        "contract": "skipped", "nccl_pending": "skipped", "nvml": "skipped", "shared_gpu_straggler": "skipped",
        "overhead": "skipped"}
    assert parts["shared_gpu_straggler"]["why"] == "no CUDA GPU on this machine"


def test_the_shared_gpu_recording_passes_part_b():
    from perftracker_ml.schemas.recording import Recording

    from benchmarks.gpu_check import judge_shared_gpu

    result = judge_shared_gpu(list(Recording(RECORDING).messages()), 2, {"step": ONSET_STEP, "how": "spin"})
    assert result["status"] == "ok" and result["culprit_named_with_gpu_evidence"] and result["false_ranks"] == []
    forward = result["forward_device_ms"]
    assert forward[2]["after"] > 10 * forward[2]["before"]  # the culprit's forward on its device
    assert result["peer_added_over_culprit_added"] < 0.5  # its peers' kernels waited far less
