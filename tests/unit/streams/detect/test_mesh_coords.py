"""A rank's DeviceMesh coordinates (EventBatch v5 ``mesh_coords``) reach its RankWindows (v4)."""

from __future__ import annotations

from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.vocabulary import FUNCTION_PATTERN, RANK_WINDOW
from perftracker_ml.streams.detect import RankSummarizer

from .test_summarize import POL, batch


def test_mesh_coords_are_carried_into_every_rank_window_and_stick():
    s = RankSummarizer("job", 3, POL)
    s.add_events({**batch(iters=[(0, 1.0, 40), (1, 2.0, 40)]), "rank": 3, "mesh_coords": {"dp": 1, "tp": 1}})
    s.add_events({**batch(seq=2, iters=[(2, 6.0, 40)], wall_at_s=6.5), "rank": 3})  # an older collector's batch
    out = s.poll(now_wall_ms=0, flush=True)
    rws = [r for n, r in out if n == RANK_WINDOW]
    assert rws and all(rw["mesh_coords"] == {"dp": 1, "tp": 1} for rw in rws)
    pats = [r for n, r in out if n == FUNCTION_PATTERN]
    assert pats and all(p["mesh_coords"] == {"dp": 1, "tp": 1} for p in pats)  # the comparison's layout peers
    assert Codec(FUNCTION_PATTERN).decode(Codec(FUNCTION_PATTERN).encode(pats[0]))["mesh_coords"] == {"dp": 1, "tp": 1}
    decoded = Codec(RANK_WINDOW).decode(Codec(RANK_WINDOW).encode(rws[0]))
    assert decoded["mesh_coords"] == {"dp": 1, "tp": 1}


def test_no_mesh_no_coords():
    s = RankSummarizer("job", 0, POL)
    s.add_events(batch(iters=[(0, 1.0, 40), (1, 2.0, 40)]))
    rws = [r for n, r in s.poll(now_wall_ms=0, flush=True) if n == RANK_WINDOW]
    assert rws and all(rw["mesh_coords"] == {} for rw in rws)
