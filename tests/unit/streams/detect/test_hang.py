"""Hang culprits: the ranks that never entered the collective the others wait in, stalled or
dead, never the waiting ranks; everyone outside collectives said so."""

import json

from perftracker_ml.streams.detect import DetectionPolicy, JobDiagnoser
from perftracker_ml.streams.detect.hang import HangState, verdict

from .synth import T0_WINDOW, W_MS, rank_window

POL = DetectionPolicy(window_s=5.0, hang_floor_s=30.0)
STALL_AT = 4  # first window without a completed iteration
LAST_SEQ = 200  # the last bucket all-reduce every rank completed


def run(state_of, ranks=4, windows=14):
    """Windows of a 4-rank job that stalls at STALL_AT; ``state_of(rank, i)`` gives the rank's
    RankWindow overrides during the stall (None: the rank sent nothing). (hang anomalies, window index
    of the first one)."""
    d = JobDiagnoser("job", POL)
    now = T0_WINDOW * W_MS
    found, first = [], None
    for i in range(windows):
        for r in range(ranks):
            extra = {} if i < STALL_AT else state_of(r, i)
            if extra is None:
                continue
            fields = {"pending_seq": LAST_SEQ, "last_function": "Model.forward", **extra}
            rw = rank_window(r, window=T0_WINDOW + i, world=ranks, steps=10 if i < STALL_AT else 0, **fields)
            d.add("RankWindow", rw, now_wall_ms=now + i * W_MS)
        hangs = [a for a in d.poll(now + i * W_MS + 8000)[0] if a["cause"] == "hang"]
        if hangs and first is None:
            first = i
        found += hangs
    return found, first


def in_ddp_allreduce(r, i):
    """Ranks 0-2 issued the next step's 5 bucket all-reduces (entered, in flight); rank 3 is
    stalled in plain Python before its forward, its sender still heartbeating."""
    if r == 3:
        return {"last_function": "train.py:prepare_batch", "batches": 1}
    return {"pending_seq": LAST_SEQ + 5, "pending_in_flight": True,
            "last_function": "comm:all_reduce:dp", "batches": 1}


def test_stalled_rank_before_forward_is_named_not_the_ranks_waiting_in_ddp_allreduce():
    found, first = run(in_ddp_allreduce)
    assert found and {tuple(a["ranks"]) for a in found} == {(3,)}
    assert first - STALL_AT <= POL.hang_floor_s / POL.window_s + 1  # within hang_floor_s + one window
    a = found[0]
    ev = json.loads(a["evidence_json"])
    assert ev["pending_group"] == "dp" and ev["pending_seq"] == LAST_SEQ + 1 and ev["collective"] == "all_reduce"
    assert ev["waiting_ranks"] == [0, 1, 2] and ev["last_functions"] == {"3": "train.py:prepare_batch"}
    assert ev["dead_ranks"] == [] and ev["stalled_ranks"] == [3]
    assert "rank 3 (stalled in train.py:prepare_batch) never entered all_reduce seq 201 of group dp" in a["summary"]
    assert "died" not in a["summary"]


def test_a_stalled_rank_s_current_stack_is_in_the_hang_and_the_waiting_ranks_stacks_are_not():
    """Rank 3's sampler keeps sampling its stuck training thread: the hang says where it is."""
    def state(r, i):
        extra = in_ddp_allreduce(r, i)
        frame = "train.py:41 prepare_batch `time.sleep(60)`" if r == 3 else "train.py:60 step `loss.backward()`"
        return {**extra, "stack_samples": 125, "stack_hz": 25.0, "top_frames": [frame],
                "top_frame_samples": [120], "top_frame_kinds": [1]}

    found, _ = run(state)
    assert found and {tuple(a["ranks"]) for a in found} == {(3,)}
    ev = json.loads(found[0]["evidence_json"])
    assert ev["stacks"] == {"3": [{"frame": "train.py:41 prepare_batch `time.sleep(60)`", "samples": 120,
                                   "share": 0.96}]}
    assert "rank 3 (stalled in train.py:prepare_batch; now at train.py:41 prepare_batch `time.sleep(60)` " \
           "(96 % of samples)) never entered all_reduce" in found[0]["summary"]


def test_no_stack_samples_means_no_stack_words():
    found, _ = run(in_ddp_allreduce)
    assert json.loads(found[0]["evidence_json"])["stacks"] == {} and "now at" not in found[0]["summary"]


def test_every_rank_stuck_outside_collectives_is_said_and_nobody_is_named():
    found, _ = run(lambda r, i: {"last_function": f"train.py:step{r}", "batches": 1})
    assert found and all(a["ranks"] == [] for a in found)
    assert "every rank is stuck outside collectives" in found[0]["summary"]
    assert "rank 2 in train.py:step2" in found[0]["summary"]


def test_dead_rank_is_named_as_dead_not_hung():
    """Rank 2's process died: its batches stopped; the others wait in the all-reduce it never entered."""
    def state(r, i):
        return None if r == 2 else in_ddp_allreduce(0, i)

    found, first = run(state)
    assert found and {tuple(a["ranks"]) for a in found} == {(2,)}
    assert first - STALL_AT <= POL.hang_floor_s / POL.window_s + 1
    assert "rank 2 (last in Model.forward): process died / stopped reporting" in found[0]["summary"]
    assert "stalled" not in found[0]["summary"]


def test_sub_group_hang_compares_only_the_sub_group_members():
    """Rank 1 stalled: ranks 0, 2, 3 wait in sub-group g0's all-reduce; ranks 4-7 (sub-group g1,
    which completed its own) wait in the world all-reduce ranks 0-3 never reached. Only rank 1."""
    state = HangState()
    state.note_collectives([
        {"function": "comm:all_reduce:world", "members": list(range(8)), "member_max_seq": [300] * 8},
        {"function": "comm:all_reduce:g0", "members": [0, 1, 2, 3], "member_max_seq": [50] * 4},
        {"function": "comm:all_reduce:g1", "members": [4, 5, 6, 7], "member_max_seq": [50] * 4},
    ])
    rws = {}
    for r in range(8):
        if r == 1:
            rws[r] = rank_window(r, pending_group="g0", pending_seq=50, last_function="train.py:slow_block")
        elif r < 4:
            rws[r] = rank_window(r, pending_group="g0", pending_seq=51, pending_in_flight=True,
                                 last_function="comm:all_reduce:g0")
        else:
            rws[r] = rank_window(r, pending_group="world", pending_seq=301, pending_in_flight=True,
                                 last_function="comm:all_reduce:world")
    state.note_window(rws)
    v = verdict(state, 5.0, POL.dead_after_heartbeats)
    assert v.culprits == [1] and v.dead == [] and not v.everyone_outside
    g0 = next(w for w in v.waits if w.group == "g0")
    assert (g0.seq, g0.waiting, g0.missing) == (51, [0, 2, 3], {1})
    world = next(w for w in v.waits if w.group == "world")
    assert world.waiting == [4, 5, 6, 7] and world.missing == {0, 1, 2, 3}  # 0, 2, 3 wait elsewhere


def live_suite_subgroup_hang(stale_rank0_seq: int) -> HangState:
    """The live suite's sub-group hang: rank 1 stalled after its pg0 calls (done, seq 2224);
    rank 0 waits in their pair group p01 (seq 1112, in flight); ranks 2, 3 wait in pg0 (2225).
    The last comparison of pg0 saw rank 0 only up to ``stale_rank0_seq``."""
    state = HangState()
    state.note_collectives([
        {"function": "comm:all_reduce:pg0", "members": [0, 1, 2, 3],
         "member_max_seq": [stale_rank0_seq, 2224, 2224, 2224]},
        {"function": "comm:all_reduce:p01", "members": [0, 1], "member_max_seq": [1111, 1111]},
        {"function": "comm:all_reduce:p23", "members": [2, 3], "member_max_seq": [1112, 1112]},
    ])
    state.note_window({
        0: rank_window(0, pending_group="p01", pending_seq=1112, pending_in_flight=True),
        1: rank_window(1, pending_group="pg0", pending_seq=2224, last_function="__main__.TrainerSGD.step"),
        2: rank_window(2, pending_group="pg0", pending_seq=2225, pending_in_flight=True),
        3: rank_window(3, pending_group="pg0", pending_seq=2225, pending_in_flight=True)})
    return state


def test_a_rank_whose_calls_completed_is_not_inside_even_ahead_of_a_stale_member():
    for stale in (2224, 2221):  # rank 0's last known pg0 seq: current, or a few calls behind
        v = verdict(live_suite_subgroup_hang(stale), 5.0, POL.dead_after_heartbeats)
        assert v.culprits == [1] and not v.everyone_outside, (stale, v)
        p01 = next(w for w in v.waits if w.group == "p01")
        assert p01.waiting == [0] and p01.missing == {1}


def test_without_entry_markers_being_ahead_still_counts_as_inside():
    """Collectors that send no entry markers: a rank ahead of a member of its group is inside."""
    state = HangState()
    state.note_collectives([{"function": "comm:all_reduce:dp", "members": [0, 1, 2, 3],
                             "member_max_seq": [200, 200, 200, 200]}])
    state.note_window({r: rank_window(r, pending_group="dp", pending_seq=200 if r == 3 else 201)
                       for r in range(4)})
    v = verdict(state, 5.0, POL.dead_after_heartbeats)
    assert v.culprits == [3] and sorted(w for wait in v.waits for w in wait.waiting) == [0, 1, 2]


def test_a_rank_silent_one_heartbeat_interval_is_not_dead():
    state = HangState()
    for i in range(3):
        state.note_window({r: rank_window(r, batches=0 if (r == 2 and i == 2) else 1) for r in range(4)})
    assert state.dead(5.0, POL.dead_after_heartbeats) == []
    for _ in range(2):
        state.note_window({r: rank_window(r) for r in range(4) if r != 2})
    assert state.dead(5.0, POL.dead_after_heartbeats) == [2]


STALL_ENDS = 12  # the stall's last window: every rank completes its calls and the exit barrier


def stall_that_ends(r, i):
    """in_ddp_allreduce until STALL_ENDS; then every rank completed the waited-in all-reduces
    and the exit barrier (no iteration finished: the loop stopped)."""
    if i < STALL_ENDS:
        return in_ddp_allreduce(r, i)
    return {"pending_group": "world", "pending_seq": 1, "pending_in_flight": False, "batches": 1,
            "last_function": "comm:barrier:world", "functions": ["comm:all_reduce:dp", "comm:barrier:world"]}


def test_a_window_in_which_every_rank_completed_collectives_ends_the_hang_without_renaming_it():
    found, first = run(stall_that_ends, windows=STALL_ENDS + 2)
    assert first is not None and first < STALL_ENDS  # the stall was named while it lasted
    assert {tuple(a["ranks"]) for a in found} == {(3,)}  # never "every rank is stuck outside collectives"
    assert not any("outside collectives" in a["summary"] for a in found)


def test_collectives_completed_by_the_waiting_ranks_alone_do_not_end_a_hang():
    def others_talk(r, i):
        st = in_ddp_allreduce(r, i)
        return st if r == 3 else {**st, "functions": ["comm:all_reduce:tp"]}  # rank 3 completes nothing

    found, _ = run(others_talk)
    assert found and {tuple(a["ranks"]) for a in found} == {(3,)}


def test_an_evaluation_pass_that_all_reduces_its_metrics_is_no_hang():
    """No optimizer step (no iteration) for 50 s, but every rank completes its metric all-reduces."""
    found, _ = run(lambda r, i: {"pending_group": "world", "pending_seq": 10 * i, "batches": 1,
                                 "last_function": "comm:all_reduce:world", "functions": ["comm:all_reduce:world"]})
    assert found == []


def test_the_flight_recorders_entries_of_the_waiting_ranks_are_in_the_hang():
    """The collectors read torch's Flight Recorder on a suspected hang (EventBatch v6); each
    waiting rank's pending entries come with the hang, what the recorder says in the summary."""
    def state(r, i):
        extra = in_ddp_allreduce(r, i)
        if r != 3:
            extra["flight_records_json"] = json.dumps([{
                "process_group": "0", "pg_desc": "default_pg", "seq": LAST_SEQ + 2, "op": "nccl:all_reduce",
                "state": "started", "age_ms": 31000, "timeout_ms": 600000, "last_completed_seq": LAST_SEQ + 1,
                "last_enqueued_seq": LAST_SEQ + 6}])
        return extra

    found, _ = run(state)
    assert found and {tuple(a["ranks"]) for a in found} == {(3,)}
    ev = json.loads(found[0]["evidence_json"])
    assert sorted(ev["flight_recorder"]) == ["0", "1", "2"]
    assert ev["flight_recorder"]["0"][0]["op"] == "nccl:all_reduce"
    assert "[Flight Recorder: rank 0: nccl:all_reduce #202 on group default_pg started for 31 s of its " \
           "600 s timeout, the group's last completed #201" in found[0]["summary"]


def test_a_flight_record_that_is_not_a_json_list_is_ignored():
    from perftracker_ml.streams.detect.hang import flight_records
    assert flight_records("not json") == [] and flight_records('{"a": 1}') == [] and flight_records("[1]") == []
