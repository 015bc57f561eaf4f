"""`perftracker demo --model transformer`: a GPT-style model, 2-way tensor parallel x 2-way FSDP2
over a (dp, tp) DeviceMesh on 4 gloo ranks (real torchrun, tansu, a Faust worker, chDB), a slow
data loader on rank 2 (mesh coordinates dp=1, tp=0). The culprit is named with its cause (and
its mesh coordinates once the collectors report them); its TP peer (rank 3) and DP peer
(rank 0), which wait for it in every all-reduce and all-gather, are not blamed. Kept to one
fault and 200 steps: the other faults are covered on the MLP (test_demo_faults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perftracker.deploy.demo.runner import run_demo
from perftracker.schemas.records import RankWindow
from perftracker.schemas.settings_loader import load_settings

from .test_demo_faults import _measured_contention, data_dir, diagnose_json  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def test_transformer_demo_names_the_slow_tp_shard_not_its_peers(data_dir: Path):  # noqa: F811
    settings = load_settings(env={"PERFTRACKER_DATA_DIR": str(data_dir)})
    lines: list[str] = []
    result = run_demo(settings, fault="slow-dataloader", ranks=4, steps=200, echo=lines.append, model="transformer")
    rows = diagnose_json(data_dir, result.job)
    log = "\n".join(lines)
    assert result.onset_wall is not None, f"the fault never started:\n{log}"
    culprits = [r for r in rows if 2 in r["ranks"] and r["cause"] == "slow_dataloader"]
    assert culprits, f"rank 2 / slow_dataloader not diagnosed:\n{json.dumps(rows, indent=1)}\n{log}"
    assert culprits[0]["function"].endswith("DataLoader.__next__")
    victims = [r for r in rows if set(r["ranks"]) - {2} and not _measured_contention(r, set(r["ranks"]) - {2})]
    assert not victims, f"its TP/DP peers blamed:\n{json.dumps(victims, indent=1)}"
    if "mesh_coords" in RankWindow.__annotations__:  # the collectors report the DeviceMesh coordinates
        assert culprits[0]["evidence"]["mesh_coords"] == {"dp": 1, "tp": 0}, culprits[0]
        assert "rank 2 (dp=1, tp=0)" in culprits[0]["summary"]
