"""Detection policy: every threshold the detectors apply, in one frozen object.

Scoring code computes numbers; this policy decides what those numbers mean.
The thresholds a user may tune are declared once, with their defaults and docs,
in :mod:`perftracker_ml.schemas.settings` (``DetectionSettings``; the window sizes
in ``StreamSettings``): their fields here take those defaults, and
:meth:`DetectionPolicy.from_settings` takes the loaded values. The other fields
are internal thresholds, documented where they are declared. ``DetectionPolicy()``
with keyword overrides serves tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ...schemas.errors import ConfigError
from ...schemas.settings import DetectionSettings, StreamSettings

TUNABLE = DetectionSettings()  # defaults of the user-tunable thresholds (section detection)
WINDOWS = StreamSettings()  # defaults of the window sizes (section streams)


class PolicyError(ConfigError):
    """A detection setting that cannot be used (e.g. a malformed peer_groups)."""


@dataclass(frozen=True)
class DetectionPolicy:
    """Thresholds and sizes. Times in seconds or ms as named; ratios are fractions.

    A field set to ``TUNABLE.x`` or ``WINDOWS.x`` is a setting (default and doc in
    schemas.settings); the others are internal.
    """

    # peer outliers (robust z = (value - median) / (1.4826 * MAD), MAD floored)
    mad_threshold: float = TUNABLE.mad_threshold
    min_excess: float = TUNABLE.min_excess
    min_cost_ms_per_step: float = TUNABLE.min_cost_ms_per_step
    min_step_share: float = 0.01  # ... and at least this share of the step time
    min_peers: int = 4  # ranks in a peer group (the rank itself included)
    noise_floor_rel: float = 0.02  # MAD floor as a fraction of the peer median
    noise_floor_ms: float = 0.05  # ... and in ms per step
    # persistence
    persist_windows: int = TUNABLE.persist_windows
    persist_steps: int = TUNABLE.persist_steps
    clear_windows: int = TUNABLE.clear_windows
    update_change: float = 0.25  # relative impact change that re-sends an incident
    # collectives: a rank is the late arriver of a (group, seq) when its time inside is the shortest
    late_fraction: float = 0.4  # of the compared seqs (one late call site among several in a group)
    late_p_value: float = 1e-4  # binomial tail vs chance (1 / members)
    # ... or last in a clear majority of few calls (see late_arrival.is_late_culprit)
    late_majority: float = 0.5  # late in more than this share of the compared seqs
    late_majority_p_value: float = 0.05  # with this binomial tail vs chance
    late_majority_step_share: float = 0.03  # and causing at least this share of the step time
    min_seqs: int = 3
    link_excess: float = 0.25  # group transfer time above peer groups' median
    # a host's own link evidence (net_links.py): a connection is backed up when its send queue held
    # more than a few full segments in at least half its samples (a link that keeps up drains it
    # between samples; small messages awaiting a delayed ACK are tens of bytes); a host
    # loses packets when at least 1% of its TCP segments are retransmits (TCP's throughput falls
    # steeply past that) and 3x the other hosts' median
    backlog_share: float = 0.5
    backlog_min_bytes: int = 4096
    retrans_pct: float = 1.0
    retrans_ratio: float = 3.0
    # expectations, as a share of the job's median step time
    gc_share: float = 0.05
    dataloader_share: float = 0.15
    python_share: float = 0.10
    # hardware evidence
    clock_ratio: float = 0.85  # sm clock / max (or / peers' median) below this is throttling
    hot_temp_c: float = 87.0
    # regression and hang
    regression_pct: float = TUNABLE.regression_pct
    history_windows: int = 120
    hang_factor: float = TUNABLE.hang_factor
    hang_floor_s: float = TUNABLE.hang_floor_s
    # windows
    window_s: float = WINDOWS.window_s
    window_grace_s: float = WINDOWS.window_grace_s
    close_lag_ms: int = 500  # a rank's data past a window's end by this much closes it
    max_open_windows: int = 8  # per summarizer / comparator; oldest evicted (counted)
    max_duration_s: float = 3600.0  # longer durations are absurd input
    idle_after_s: float = 600.0  # state with no input for this long may be dropped
    catch_up_margin_ms: int = 5000  # behind the job (a backlog), a missing rank or record waits its grace plus
    # this much of the job's data time (the skew between the partitions read): streams/detect/job_clock.py
    peer_groups: str = TUNABLE.peer_groups
    # engine rules that were module constants (same values); all ratios are fractions
    future_slack_ms: int = 1000  # an event may end at most this long after its batch's wall time
    intermittent_min_calls: int = 6  # a tail-only (p90) slowdown needs this many calls in the window
    explains_share: float = 0.7  # GC (or extra calls) explains a rank when its excess is >= this share of the largest
    absorbed_share: float = 0.5  # a rank's excess came out of its wait for a late culprit when it waits less than
    # the group's other waiting members by this share of it (and at least the whole excess): stragglers.drop_absorbed
    propagated_wait_share: float = 0.5  # a late arriver that itself waited >= this share of the wait it caused is a victim
    step_wrapper_share: float = 0.5  # a Python function above this share of the step is the step wrapper: no expectation
    regression_explained_share: float = 0.5  # root causes covering this share of a regression absorb it
    full_progress_share: float = 0.5  # a window counts as clean when the job ran this share of its usual steps
    profile_request_ahead_steps: int = 5  # a PROFILE request starts this many steps past the latest step seen
    profile_request_duration_s: float = 20.0  # ... and lasts this long (or profile_max_steps iterations, collectors)
    profile_request_cooldown_windows: int = 12  # at most one PROFILE request per this many windows
    # CPU evidence (streams/detect/cpu_evidence.py): a rank "waited for a CPU more than its peers" when
    cpu_wait_min_ms: float = 0.5  # its run-queue wait per step exceeds the peers' median by this much
    cpu_wait_share: float = 0.25  # ... and by this share of the rank's excess step time
    host_join_share: float = 0.5  # a host peer joins a host-level finding with this share of its culprits' extra run-queue wait
    switch_ratio: float = 2.0  # or its involuntary switches per step are this many times the peers'
    switch_min_per_step: float = 5.0  # ... and at least this many more per step
    steal_excess_pct: float = 5.0  # or its host's steal share exceeds the peers' by this many points
    # ... unless its own extra CPU time per step (vs the peers' median) is this share of its excess
    # step time: then the wait comes with work it does itself (a slow phase), not a competitor
    cpu_work_share: float = 0.25
    location_min_ms: float = 1.0  # a sampled frame names where a rank's extra time goes from this many ms/step
    location_noise_sigmas: float = 2.0  # frames ranked by excess minus this many sigmas of sampling noise
    # periodic stalls (streams/detect/stalls.py): one call at which the last arriver kept the other
    # members waiting this many of the window's steps and this long is a stall (late_arrival.py)
    stall_steps: float = 2.0
    stall_min_ms: float = 50.0
    max_stalls: int = 8  # stalls kept per collective group and window (the largest)
    stall_horizon_windows: int = 24  # windows over which a rank's stalls are counted
    stall_min_count: int = 3  # a rank is named after this many stalls of one group in the horizon
    stall_rank_share: float = 0.5  # ... more than this share of that group's stalls
    stall_step_share: float = 0.03  # ... costing this share of the step (and min_cost_ms_per_step)
    stall_period_cv: float = 0.5  # gaps within this spread (std / median) are a regular period
    stall_recent_periods: float = 2.0  # named while its last stall is at most this many periods (or windows) old
    # rule thresholds that were module constants or bare numbers of the rule modules (same values)
    extra_calls_share: float = 0.5  # more calls per step than the peers make a rank slow when they are this share of its excess (peers._sustained)
    rare_max_calls: int = 3  # a rank's calls of a function in one window at most this many: rare (rare.py)
    rare_horizon_windows: int = 6  # windows a rare function's outlier is judged over, this one included (rare.py)
    link_min_hosts: int = 3  # fewer hosts: the two ends of a link look alike from their send queues (net_links.py)
    late_entry_extra_windows: int = 1  # a late entry (arrival order alone) persists this many windows more (late_entries.py)
    onset_sustained_share: float = 0.8  # an onset: this share of the steps after it above the usual (onset.py)
    onset_min_before: int = 10  # steps before an onset to know the rank's usual step time (onset.py)
    onset_usual_percentile: float = 90.0  # a step after the onset is slow above this percentile of those before (onset.py)
    strong_regression: float = 2.0  # a regression excess this many times what a regression needs is strong (job_checks.py)
    regression_step_quantile: float = 25.0  # a window's step time: this percentile of each rank's steps, spikes left out (job_checks.py)
    regression_best_percentile: float = 25.0  # a regression's baseline: this percentile of the windows before the recent ones (liveness.py)
    regression_min_past: int = 2  # windows before the recent ones a regression needs to compare against (liveness.py)
    dead_after_heartbeats: float = 2.0  # a rank silent this many heartbeat intervals is gone (hang.py)
    hang_recent_heartbeats: float = 1.5  # a hung job's collectors sent a batch within this many heartbeat intervals (liveness.py)
    hang_heartbeat_share: float = 0.5  # ... and at least this share of the heartbeats expected through the stall (liveness.py)
    rank_window_wait_ms: int = 1000  # a window with RankWindows only (no comparison) waits two graces plus this (job_windows.py)
    # sharded diagnosis (shards.py): a window of more ranks than this is diagnosed in shards of about
    # this many ranks, then merged (the same findings); 0: never. Off by default: in one process the
    # shards cost ~20 % more CPU and save none; it pays once shards travel to other workers
    diagnose_shard_ranks: int = 0
    # overload: records a stage's cores may hold waiting (the diagnosers' buffered windows: a 100k-rank
    # job's window is ~125,000); past it the stage sheds whole jobs, the one holding the most first,
    # counted (topology.Cores.shed); 0: never
    shed_backlog_records: int = 2_000_000
    # the FunctionPatterns of one function and the RankWindows of one job a summarize stage closes
    # together (one chunk's poll) for a window go on as one set of columns (schemas/record_sets.py)
    # when there are at least this many; 0: never (a rolling upgrade with readers older than sets)
    record_set_min: int = 2

    @property
    def window_ms(self) -> int:
        return int(round(self.window_s * 1000))

    @property
    def grace_ms(self) -> int:
        return int(round(self.window_grace_s * 1000))

    @classmethod
    def from_settings(cls, detection: DetectionSettings | None = None,
                      streams: StreamSettings | None = None) -> DetectionPolicy:
        """The loaded settings' thresholds and window sizes; internal thresholds keep their defaults."""
        detection = detection or TUNABLE
        streams = streams or WINDOWS
        policy = cls(**{f.name: getattr(detection, f.name) for f in fields(DetectionSettings)},
                     window_s=streams.window_s, window_grace_s=streams.window_grace_s,
                     record_set_min=cls.record_set_min if streams.record_sets else 0)
        policy.peer_group_map()  # validate at start-up, not at the first window
        return policy

    def peer_group_map(self) -> dict[int, str]:
        """Parse ``'a=0-7,16-23;b=8-15'`` into {rank: group name}; empty when unset."""
        return parse_peer_groups(self.peer_groups)


def parse_peer_groups(text: str) -> dict[int, str]:
    """``name=lo-hi,n;name2=...`` -> {rank: name}. Raises PolicyError with what to fix."""
    out: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        name, sep, spec = part.partition("=")
        if not sep or not name.strip():
            raise PolicyError(f"peer_groups: {part!r} must look like 'name=0-7,16-23'")
        for item in filter(None, (s.strip() for s in spec.split(","))):
            lo, dash, hi = item.partition("-")
            try:
                first, last = int(lo), int(hi) if dash else int(lo)
            except ValueError:
                raise PolicyError(f"peer_groups: {item!r} in {name!r} is not a rank or range") from None
            if first < 0 or last < first:
                raise PolicyError(f"peer_groups: range {item!r} in {name!r} is empty or negative")
            for rank in range(first, last + 1):
                if rank in out:
                    raise PolicyError(f"peer_groups: rank {rank} is in both {out[rank]!r} and {name!r}")
                out[rank] = name.strip()
    return out
