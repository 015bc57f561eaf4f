"""The EventBatch version a collector writes: v9 (packed columns, process groups' members as
ranges) by default, v8 or v7 on request while some stream workers cannot read the newer one yet
(a rollout upgrades the workers first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.records import group_members
from perftracker_ml.schemas.spool import read_spool
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

SCRIPT = """
import perftracker_ml.collectors.api as api
import os
c = api.attach("v-job", env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
rec = c.recorder
rec.span(0, "f", 1, 2)
from perftracker_ml.collectors.events import GroupRef
rec.comm("all_reduce", GroupRef("pg1-4-x", (0, 2, 4, 6)), 0, 64, 0, 3, 4)  # equally spaced members
rec.comm("all_reduce", GroupRef("pg2-3-y", (0, 1, 5)), 0, 64, 0, 5, 4)
api.detach()
"""


def _written(tmp_path: Path, **env: str) -> list[dict]:
    spool = tmp_path / "spool"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**base, "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": f"spool:{spool}", **env})
    assert out.returncode == 0, out.stderr
    codec = Codec(EVENT_BATCH)
    return [codec.decode(m.value) for m in read_spool(spool) if m.topic.endswith("events")]


def test_v9_by_default_v8_and_v7_while_the_workers_are_upgraded(tmp_path):
    """v9 sends the equally spaced group as a range, the other listed; v8 and v7 list both (a
    v8 reader would take a range's empty list for a group without members)."""
    for version, env in ((9, {}), (8, {"PERFTRACKER_COLLECTOR_EVENT_BATCH_VERSION": "8"}),
                         (7, {"PERFTRACKER_COLLECTOR_EVENT_BATCH_VERSION": "7"})):
        batches = _written(tmp_path / str(version), **env)
        assert {int(b["schema_version"]) for b in batches} == {version}
        groups = {g["group_id"]: g for b in batches for g in b["groups"]}
        assert group_members(groups["pg1-4-x"]) == [0, 2, 4, 6] and group_members(groups["pg2-3-y"]) == [0, 1, 5]
        assert (groups["pg1-4-x"]["ranks"] == []) == (version == 9) and groups["pg2-3-y"]["ranks"] == [0, 1, 5]
