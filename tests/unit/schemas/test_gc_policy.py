"""The worker's garbage-collector policy (schemas/gc_policy.py), run in a child process so the
test session's own collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from perftracker_ml.schemas.gc_policy import tune_gc
before = gc.get_freeze_count()
out = {"default": list(tune_gc(0)), "frozen_after_default": gc.get_freeze_count() - before}
out["tuned"] = list(tune_gc(50_000))
out["frozen"] = gc.get_freeze_count()
a = []; a.append(a); del a  # a cycle made after start-up is still collected
out["collected"] = gc.collect()
print(json.dumps(out))
"""


def test_tune_gc_freezes_start_up_and_raises_the_young_threshold_and_zero_leaves_cpython_s() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["default"] == [700, 10, 10] and out["frozen_after_default"] == 0
    assert out["tuned"] == [50_000, 20, 100]
    assert out["frozen"] > 1000  # the modules and objects start-up made
    assert out["collected"] >= 1
