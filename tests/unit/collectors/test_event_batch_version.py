"""The EventBatch version a collector writes: v8 (packed columns) by default, v7 on request
while some stream workers cannot read v8 yet (a rollout upgrades the workers first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.spool import read_spool
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

SCRIPT = """
import perftracker_ml.collectors.api as api
import os
c = api.attach("v-job", env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
rec = c.recorder
rec.span(0, "f", 1, 2)
api.detach()
"""


def _written_versions(tmp_path: Path, **env: str) -> set[int]:
    spool = tmp_path / "spool"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**base, "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": f"spool:{spool}", **env})
    assert out.returncode == 0, out.stderr
    codec = Codec(EVENT_BATCH)
    return {int(codec.decode(m.value)["schema_version"]) for m in read_spool(spool) if m.topic.endswith("events")}


def test_v8_by_default_and_v7_while_the_workers_are_upgraded(tmp_path):
    assert _written_versions(tmp_path / "a") == {8}
    assert _written_versions(tmp_path / "b", PERFTRACKER_COLLECTOR_EVENT_BATCH_VERSION="7") == {7}
