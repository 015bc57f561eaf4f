"""The records passed between detection stages, typed: one TypedDict per Avro record.

They stay plain dicts (the codec encodes dicts; ``FunctionPattern(job=..., ...)`` builds
one), so the types cost nothing at run time. Field names follow the latest bundled
``*.vN.avsc`` schemas (a unit test holds them equal); units are in the names, times in
``*_ms`` are wall-clock milliseconds (a decoded record holds a ``datetime`` in the
fields the schema marks timestamp-millis; the core reads them with ``to_ms``), window
ids count windows since the epoch.
Stage 1 emits FunctionPattern and RankWindow, stage 2 FunctionComparison, stage 3
Anomaly and Control (see ``perftracker_ml.streams.topology``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


class RankWindowHeader(TypedDict):
    """The fields every record of one rank's window starts with."""

    schema_version: int
    job: str
    window_id: int
    window_start_ms: int
    window_s: float
    rank: int
    world_size: int
    host: str
    gpu: int
    signature: str  # hash of the rank's structural function set


class FunctionPattern(RankWindowHeader):
    """One function (or collective) on one rank in one window."""

    function: str
    kind: int  # SpanKind
    steps: int  # steps completed in the window
    count: int
    total_ns: int
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int
    hist: list[int]  # the histogram from bucket 0 (up to v2; empty from v3: hist_first, hist_counts)
    group_ranks: list[int]
    bytes: int
    seqs: list[int]  # collectives: the seq of every call
    seq_dur_ns: list[int]  # and the time spent inside it
    mesh_coords: dict[str, int]  # the rank's DeviceMesh coordinate per dim name, {} without a mesh (v2)
    hist_first: int  # the bucket of hist_counts[0] (v3)
    hist_counts: list[int]  # the histogram from its lowest bucket held to its highest (v3)
    group_ranks_first: int  # a collective's group as a range of members (v3; group_ranks then empty)
    group_ranks_step: int
    group_ranks_count: int


NO_MEMBERS_RANGE = (0, 0, 0)  # (first, step, count) of members that are listed, not a range
MEMBERS_RANGE_FROM = 9  # the first EventBatch version whose process groups may give members as a range
GROUP_RANGE_FROM = 3  # the first FunctionPattern version whose group_ranks may be a range


def pattern_as_v2(pattern: dict) -> dict:
    """``pattern`` as FunctionPattern v1/v2 carry it: its group's members listed and its histogram
    whole from bucket 0 (a writer before v3 has no fields for a range or a trimmed histogram, and
    would send the group without members and no histogram); the pattern itself when nothing is
    given so. The pattern is not changed."""
    ranged, trimmed = pattern.get("group_ranks_count"), pattern.get("hist_counts")
    if not ranged and not trimmed:
        return pattern
    out = {**pattern, "group_ranks": group_members(pattern, "group_ranks"), "group_ranks_count": 0}
    if trimmed:
        out.update(hist=full_histogram(pattern), hist_first=0, hist_counts=[])
    return out


def group_entry(group_id: str, ranks: Sequence[int], as_range: bool = True) -> dict[str, Any]:
    """An EventBatch ``groups[]`` item: the members as a range when ``as_range`` (a v9 writer) and
    they are one (:func:`members_range`), else listed."""
    span = members_range(ranks) if as_range else None
    if span is None:
        return {"group_id": group_id, "ranks": [int(r) for r in ranks]}
    return {"group_id": group_id, "ranks": [], "ranks_first": span[0], "ranks_step": span[1], "ranks_count": span[2]}


def listed_groups(batch: dict) -> dict:
    """``batch`` with every process group's members listed (a writer before EventBatch v9, which
    would drop a range's fields and send a group without members); ``batch`` itself when none is
    a range. The batch is not changed."""
    groups = batch.get("groups") or []
    if not any(g.get("ranks_count") for g in groups):
        return batch
    return {**batch, "groups": [group_entry(g["group_id"], group_members(g), as_range=False) if g.get("ranks_count")
                                else g for g in groups]}


def group_members(group: Mapping[str, Any], prefix: str = "ranks") -> list[int]:
    """A process group's members, whatever its version wrote: ``<prefix>`` listed, then the range
    of ``<prefix>_count`` ranks from ``<prefix>_first`` by ``<prefix>_step`` (EventBatch v9's
    ``groups[]``; a FunctionPattern v3 with ``prefix="group_ranks"``)."""
    listed = [int(r) for r in group.get(prefix) or ()]
    count = int(group.get(f"{prefix}_count") or 0)
    first, step = int(group.get(f"{prefix}_first") or 0), int(group.get(f"{prefix}_step") or 0)
    if count <= 0 or step < 1:  # listed only (a range without a step is refused by validation)
        return listed
    return listed + list(range(first, first + step * count, step))


def group_size(group: Mapping[str, Any], prefix: str = "ranks") -> int:
    """How many distinct members :func:`group_members` gives, without building the list of a range."""
    count = int(group.get(f"{prefix}_count") or 0)
    listed = group.get(prefix) or ()
    if count <= 0 or int(group.get(f"{prefix}_step") or 0) < 1:
        return len(set(listed))
    return count if not listed else len(set(group_members(group, prefix)))


def members_range(ranks: Sequence[int], least: int = 3) -> tuple[int, int, int] | None:
    """``(first, step, count)`` when ``ranks`` (at least ``least`` of them) are a range of
    equally spaced increasing ranks (a data-, tensor- or pipeline-parallel group always is),
    else None: they travel listed."""
    n = len(ranks)
    if n < least:
        return None
    first, step = int(ranks[0]), int(ranks[1]) - int(ranks[0])
    if step < 1 or any(int(r) != first + i * step for i, r in enumerate(ranks)):
        return None
    return first, step, n


def full_histogram(pattern: FunctionPattern | dict) -> list[int]:
    """A pattern's histogram from bucket 0, whatever its version wrote: ``hist`` (v1, v2), or
    ``hist_first`` zeros and ``hist_counts`` (v3)."""
    return [*(pattern.get("hist") or ()), *[0] * int(pattern.get("hist_first") or 0), *(pattern.get("hist_counts") or ())]


class RankHardware(TypedDict):
    """One rank's hardware samples in one window, reduced (-1 when none were taken)."""

    hw_samples: int
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    temp_c_max: float
    power_w_mean: float
    util_gpu_pct: float
    throttle_reasons: int
    pcie_gen_min: int
    pcie_width_min: int
    nvlink_errors: int
    ecc_uncorrected: int
    xid: int


class RankCpu(TypedDict):
    """One rank's CPU evidence in one window (-1 unknown) and its most sampled Python frames."""

    cpu_samples: int
    cpu_ratio: float
    runqueue_wait_ms_per_step: float
    involuntary_switches_per_step: float
    voluntary_switches_per_step: float
    major_faults: int
    load1: float
    steal_pct: float
    stack_samples: int
    stack_hz: float
    top_frames: list[str]
    top_frame_samples: list[int]
    top_frame_kinds: list[int]


class RankNet(TypedDict):
    """One rank's network evidence in one window (v6; rank_window.v6.avsc documents each; -1 unknown)."""

    net_samples: int
    net_addr: str
    net_retrans_pct: float
    net_tx_mb_per_s: float
    net_rx_mb_per_s: float
    net_backlog_json: str
    ib_xmit_wait_per_s: float
    ib_errors: int


class RankWindow(RankWindowHeader, RankHardware, RankCpu, RankNet):
    """One rank in one window: header, what it did and how its data arrived (below), its
    hardware and CPU summaries (the bases). Built as the schema orders the fields: header,
    these up to ``bytes_received``, hardware, ``batches``, CPU."""

    functions: list[str]
    steps: int
    last_step: int
    step_time_ns: list[int]
    last_event_ms: int
    last_function: str
    pending_group: str
    pending_seq: int
    pending_in_flight: bool  # the pending collective was entered and has not completed
    dropped_events: int
    lost_batches: int
    bytes_received: int
    batches: int  # batches (heartbeats included) since the previous window closed
    ended_cleanly: bool  # the rank's last window: its collector sent its final batch (v3)
    restarts: int  # times the rank's process was replaced under the same job id (new pid, v3)
    mesh_coords: dict[str, int]  # the rank's DeviceMesh coordinate per dim name, {} without a mesh (v4)
    gpu_uuid: str  # the rank's GPU as NVML names it, '' without a GPU or NVML (v5)
    flight_records_json: str  # Flight Recorder entries of its pending collectives (a JSON list), '' when none (v5)


class PeerGroupStat(TypedDict):
    key: str
    size: int
    median_ms_per_step: float
    median_calls_per_step: float
    ranks: list[int]


class RankOutlier(TypedDict):
    rank: int
    host: str
    gpu: int
    peer_group: str
    value_ms_per_step: float
    peer_median_ms_per_step: float
    ratio: float
    robust_z: float
    cost_ms_per_step: float
    calls_ratio: float
    per_call_ratio: float
    intermittent: bool


class Straggler(TypedDict):
    rank: int
    host: str
    gpu: int
    late_seqs: int
    late_fraction: float
    caused_ms_per_step: float
    p_value: float


class CollectiveStall(TypedDict):
    """One call of a collective group at which one member kept the others waiting (v3)."""

    rank: int
    host: str
    gpu: int
    seq: int
    wait_ms: float
    seqs_per_step: float


class FunctionComparison(TypedDict):
    """One function across all ranks in one window: peer outliers or collective stragglers."""

    schema_version: int
    job: str
    window_id: int
    window_start_ms: int
    window_s: float
    function: str
    kind: int
    ranks_seen: int
    ranks_scored: int
    peer_groups: int
    median_ms_per_step: float
    groups: list[PeerGroupStat]
    outliers: list[RankOutlier]
    members: list[int]
    member_max_seq: list[int]
    member_wait_ms_per_step: list[float]
    mixed_signatures: bool
    seqs_compared: int
    transfer_ms_median: float
    transfer_ms_per_step: float
    wait_ms_per_step: float
    bytes_per_call: float
    stragglers: list[Straggler]
    skipped: dict[str, int]
    minor_outliers: list[RankOutlier]  # v2: above peers in all but cost; explain late arrivals only
    stalls: list[CollectiveStall]  # v3: single calls that kept the other members waiting for steps


class Anomaly(TypedDict):
    """One state of an incident: OPEN, UPDATED or RESOLVED."""

    schema_version: int
    incident_id: str
    job: str
    status: str  # Status value
    kind: str  # Kind value
    cause: str  # Cause value
    ranks: list[int]
    hosts: list[str]
    gpus: list[int]
    function: str
    score: float
    impact_ms_per_step: float
    step_time_ms: float
    first_seen_ms: int
    last_seen_ms: int
    windows: int
    summary: str
    evidence_json: str
    resolved_reason: str  # RESOLVED only: "cleared", "job finished" or "job died" (v2)


class Control(TypedDict):
    """A request to a job's collectors (e.g. a synchronized PROFILE)."""

    schema_version: int
    job: str
    request_id: str
    command: str
    start_step: int
    duration_s: float
    reason: str
    issued_ms: int


class RecordSet(TypedDict, total=False):
    """RankWindowSet, FunctionPatternSet: records of one key and window closed together, as columns
    (schemas/record_sets.py: the set-wide fields here; every other field one value per record)."""

    schema_version: int
    job: str
    window_id: int
    window_start_ms: int
    window_s: float
    ranks: int
    function: str  # a FunctionPatternSet's
    function_names: list[str]  # a RankWindowSet's; its ``functions`` are int32 positions in it


# what one stage hands to the next (the record's name travels beside it)
StageRecord = FunctionPattern | RankWindow | FunctionComparison | Anomaly | Control | RecordSet
