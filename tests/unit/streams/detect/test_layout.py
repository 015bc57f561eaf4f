"""Layout-aware peers: from mesh coordinates, stage imbalance is not a fault, a slow TP shard is."""

from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect import DetectionPolicy, FunctionComparator
from perftracker_ml.streams.detect.layout import coords_of, layout_peer_map
from perftracker_ml.streams.detect.window import diagnose_window

from .synth import T0_WINDOW, pattern, rank_window

POL = DetectionPolicy()


def pp_tp_dp(rank: int) -> dict[str, int]:
    """16 ranks as a (pp=2, dp=4, tp=2) mesh, tp fastest."""
    return {"pp": rank // 8, "dp": (rank // 2) % 4, "tp": rank % 2}


def evaluate(function, patterns, policy=POL):
    c = FunctionComparator("job", function, policy)
    for p in patterns:
        c.add(p, now_wall_ms=1000)
    return c.poll(1001 + policy.grace_ms)[0], c


# ---- the pure function ------------------------------------------------------------------

def test_same_stage_and_tp_position_are_peers():
    peers = layout_peer_map({r: pp_tp_dp(r) for r in range(16)})
    assert peers[0] == peers[2] == peers[6] == "layout:pp=0,tp=0"
    assert peers[1] == "layout:pp=0,tp=1" and peers[9] == "layout:pp=1,tp=1"
    assert len(set(peers.values())) == 4


def test_groups_too_small_to_score_drop_the_tp_position_not_the_stage():
    two_by_two = {r: {"dp": r // 2, "tp": r % 2} for r in range(4)}  # groups of 2 < min_peers
    assert set(layout_peer_map(two_by_two).values()) == {"layout:all"}
    pp = {r: {"pp": r // 4, "dp": (r // 2) % 2, "tp": r % 2} for r in range(8)}
    assert layout_peer_map(pp) == {r: f"layout:pp={r // 4}" for r in range(8)}


def test_no_coordinates_or_data_parallel_only_fall_back_to_all_ranks():
    assert layout_peer_map({}) == {}
    assert layout_peer_map({0: {}, 1: {}}) == {}
    assert layout_peer_map({r: {"dp": r} for r in range(8)}) == {}
    peers = layout_peer_map({0: {"pp": 0}, 1: {"pp": 0}, 2: {"pp": 0}, 3: {}})
    assert 3 not in peers and set(peers.values()) == {"layout:pp=0"}


def test_coords_of_keeps_well_formed_entries_only():
    assert coords_of({"mesh_coords": {"dp": 1, "tp": "0", "pp": None}}) == {"dp": 1, "tp": 0}
    assert coords_of({"mesh_coords": None}) == {} and coords_of(None) == {} and coords_of({"mesh_coords": 3}) == {}


# ---- the comparator ---------------------------------------------------------------------

def test_pipeline_stage_imbalance_is_not_an_outlier_with_coordinates():
    # stage 1 (ranks 8-15) runs more layers: 150 ms vs 100 ms; same signature everywhere
    pats = [pattern(r, "kind:forward", 100.0 if r < 8 else 150.0, mesh_coords=pp_tp_dp(r), world_size=16)
            for r in range(16)]
    rec, _ = evaluate("kind:forward", pats)
    assert rec["outliers"] == []
    assert {g["key"] for g in rec["groups"]} == {f"layout:pp={s},tp={t}" for s in (0, 1) for t in (0, 1)}
    # the same patterns without coordinates: one group, the whole stage flagged
    plain = [{k: v for k, v in p.items() if k != "mesh_coords"} for p in pats]
    rec, _ = evaluate("kind:forward", plain)
    assert rec["peer_groups"] == 1


def test_slow_tp_shard_is_an_outlier_among_its_layout_peers():
    pats = [pattern(r, "Block.forward", 100.0 if r < 8 else 150.0, mesh_coords=pp_tp_dp(r), world_size=16)
            for r in range(16)]
    pats[5] = pattern(5, "Block.forward", 160.0, mesh_coords=pp_tp_dp(5), world_size=16)  # pp=0, tp=1
    rec, _ = evaluate("Block.forward", pats)
    (o,) = rec["outliers"]
    assert o["rank"] == 5 and o["peer_group"] == "layout:pp=0,tp=1"


def test_configured_peer_groups_win_over_the_layout():
    pol = DetectionPolicy(peer_groups="a=0-15")
    pats = [pattern(r, "f", 100.0, mesh_coords=pp_tp_dp(r), world_size=16) for r in range(16)]
    rec, _ = evaluate("f", pats, pol)
    assert {g["key"] for g in rec["groups"]} == {"a"}


# ---- the diagnoser (coordinates from the RankWindows only) ------------------------------

def comparison(function, outliers, ranks):
    return {"job": "job", "window_id": T0_WINDOW, "window_start_ms": 0, "window_s": 5.0, "function": function,
            "kind": int(SpanKind.FORWARD), "ranks_seen": len(ranks), "ranks_scored": len(ranks), "peer_groups": 1,
            "median_ms_per_step": 100.0, "groups": [], "members": [], "member_max_seq": [],
            "mixed_signatures": False, "member_wait_ms_per_step": [], "seqs_compared": 0,
            "transfer_ms_median": 0.0, "transfer_ms_per_step": 0.0, "wait_ms_per_step": 0.0,
            "bytes_per_call": 0.0, "stragglers": [], "skipped": {},
            "outliers": [{"rank": r, "host": f"host{r}", "gpu": -1, "peer_group": "sig:s", "value_ms_per_step": 150.0,
                          "peer_median_ms_per_step": 100.0, "ratio": 1.5, "robust_z": 8.0,
                          "cost_ms_per_step": 50.0, "calls_ratio": 1.0, "per_call_ratio": 1.5,
                          "intermittent": False} for r in outliers]}


def windows(coords):
    return {r: rank_window(r, world=len(coords), functions=["kind:forward"], mesh_coords=c, gpu=-1)
            for r, c in coords.items()}


def test_diagnoser_drops_a_whole_stage_flagged_without_layout_peers():
    coords = {r: {"pp": r // 2, "dp": r % 2} for r in range(4)}
    found = diagnose_window(windows(coords), [comparison("kind:forward", [2, 3], range(4))], POL)
    assert not [f for f in found if set(f.ranks) & {2, 3}]


def test_diagnoser_keeps_one_slow_rank_of_a_stage_and_names_its_coordinates():
    coords = {r: {"dp": r // 2, "tp": r % 2} for r in range(4)}
    found = diagnose_window(windows(coords), [comparison("kind:forward", [2], range(4))], POL)
    (f,) = [f for f in found if f.ranks == (2,)]
    assert f.evidence["mesh_coords"] == {"dp": 1, "tp": 0} and f.mesh_coords == {"dp": 1, "tp": 0}
    assert f.subject == "rank 2"  # the summary renders the coordinates after it (test_pipeline.py)


# ---- a stage with fewer replicas than a robust score needs --------------------------------

def pp2_dp2(rank: int) -> dict[str, int]:
    """4 ranks as (pp=2, dp=2): each stage's group has two replicas."""
    return {"pp": rank // 2, "dp": rank % 2}


def two_by_two(ms: dict[int, float], function: str = "torch.utils.data.DataLoader.__next__") -> dict:
    pats = [pattern(r, function, ms[r], mesh_coords=pp2_dp2(r), world_size=4, steps=10) for r in range(4)]
    return evaluate(function, pats)[0]


def test_one_replica_far_above_its_stage_mate_is_an_outlier_of_its_stage():
    rec = two_by_two({0: 0.5, 1: 0.5, 2: 15.0, 3: 0.5})
    (o,) = rec["outliers"]
    assert (o["rank"], o["peer_group"]) == (2, "layout:pp=1")
    assert o["peer_median_ms_per_step"] == 0.5 and o["cost_ms_per_step"] == 14.5


def test_both_replicas_of_a_stage_slower_is_its_shape_not_an_outlier():
    rec = two_by_two({0: 10.0, 1: 10.0, 2: 14.0, 3: 14.0}, "Block.forward")
    assert rec["outliers"] == []


def test_a_replica_a_little_above_its_stage_mate_is_noise_a_pair_cannot_tell_apart():
    # 12 % above: past min_excess, but within the spread a pair is granted (min_excess of its base x mad_threshold)
    rec = two_by_two({0: 13.6, 1: 12.1, 2: 20.0, 3: 20.0}, "Sequential.forward")
    assert rec["outliers"] == []
