"""Root-cause classes (``Anomaly.cause``) and the words people read for each.

One entry per cause in :data:`CAUSES`: the title of an incident card, the reason a
finding's one-line summary gives, the explanation the card shows (``{who}`` becomes the
ranks) and the advice (what to check first). Summaries, the HTML report and the CLI read
them from here. Adding a cause: one member of :class:`Cause` and one entry in
:data:`CAUSES`, plus the classifier rule that finds it (``streams/detect``); the
``anomaly.v1.avsc`` doc of the ``cause`` field lists the ids (a test holds all three
together). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Cause(str, Enum):
    """Anomaly.cause: the root-cause class (its value is the id on the wire)."""

    SLOW_GPU = "slow_gpu"
    GPU_THROTTLE = "gpu_throttle"
    SLOW_LINK = "slow_link"
    HOST_CPU_CONTENTION = "host_cpu_contention"
    SLOW_DATALOADER = "slow_dataloader"
    GC_PAUSE = "gc_pause"
    STAGE_IMBALANCE = "stage_imbalance"
    DATA_IMBALANCE = "data_imbalance"
    SHARED_INEFFICIENCY = "shared_inefficiency"
    REGRESSION = "regression"
    HANG = "hang"
    SLOW_FUNCTION = "slow_function"


@dataclass(frozen=True)
class CauseWords:
    """What people read about one cause."""

    title: str  # heading of an incident card: "Slow data loader"
    reason: str  # ends a rank finding's summary: "rank 2 on h1: f takes ... - <reason>; costs ..."
    explanation: str  # the incident card's "why"; ``{who}`` is replaced by the ranks
    advice: str  # what to check first


CAUSES: dict[Cause, CauseWords] = {
    Cause.SLOW_GPU: CauseWords(
        title="Slow GPU",
        reason="its GPU computes slower than its peers' (no throttling seen)",
        explanation="Kernels run slower on {who}'s GPU than on identical peers.",
        advice="Check that GPU for faults (nvidia-smi -q: ECC errors, retired pages, PCIe link "
               "width) and for other processes using it; move the job off it if it stays slow."),
    Cause.GPU_THROTTLE: CauseWords(
        title="GPU throttling",
        reason="its GPU is throttled",
        explanation="{who}'s GPU runs below its normal clocks (throttling), so its kernels are "
                    "slow.",
        advice="Check the GPU's cooling and power limits (nvidia-smi -q -d PERFORMANCE shows the "
               "throttle reasons); fix the airflow or the power cap, or move the job off the node."),
    Cause.SLOW_LINK: CauseWords(
        title="Slow link / late collective",
        reason="a slow network/PCIe link",
        explanation="{who} enters the collective late or moves data slowly; the other ranks spend "
                    "the difference waiting inside the call.",
        advice="Check the links of the named ranks' hosts (NIC and switch error counters, "
               "PCIe/NVLink width; NCCL_DEBUG=INFO shows the transport) and what other traffic "
               "shares them."),
    Cause.HOST_CPU_CONTENTION: CauseWords(
        title="CPU contention on the host",
        reason="its host CPU is contended (the evidence in brackets says how we know)",
        explanation="{who} gets less CPU than its peers (another process competes for its core), "
                    "so its Python and compute run slower and the others wait.",
        advice="Look for other processes competing for the host's cores (top, pidstat); give the "
               "rank and its data loader workers cores of their own (taskset, OMP_NUM_THREADS)."),
    Cause.SLOW_DATALOADER: CauseWords(
        title="Slow data loader",
        reason="its data loader is slow",
        explanation="Fetching the next batch takes longer on {who} than on its peers, so {who} "
                    "reaches the gradient all_reduce last and every other rank waits for it.",
        advice="Check the storage or network that rank reads from and its loader's num_workers and"
               " prefetch_factor; move heavy preprocessing out of the training step."),
    Cause.GC_PAUSE: CauseWords(
        title="Garbage-collection pauses",
        reason="Python garbage collection pauses",
        explanation="Python's garbage collector pauses {who} for long stretches; the pauses delay "
                    "its arrival at the collectives and every other rank waits.",
        advice="Create less garbage per step, or call gc.freeze() after setup and run gc.collect()"
               " at the same point of a step on every rank instead of at random."),
    Cause.STAGE_IMBALANCE: CauseWords(
        title="Pipeline stage imbalance",
        reason="its pipeline stage carries more work than the others",
        explanation="Pipeline stages carry unequal work; {who} does more per step.",
        advice="Rebalance the pipeline: move layers from the slow stage to its neighbours so every"
               " stage does the same work per step."),
    Cause.DATA_IMBALANCE: CauseWords(
        title="Data imbalance",
        reason="it gets more work per step than its peers (data/MoE imbalance, not a fault)",
        explanation="{who} gets larger or harder batches than its peers.",
        advice="Balance the work per rank: bucket or pack samples by length, or check the MoE "
               "router's load balancing; no hardware is at fault."),
    Cause.SHARED_INEFFICIENCY: CauseWords(
        title="Inefficiency shared by all ranks",
        reason="every rank spends too long here (not one bad rank)",
        explanation="Every rank spends more time here than expected; this is not one bad rank.",
        advice="Optimize the function itself, since every rank pays for it: profile one rank (the "
               "PyTorch profiler) to see where the time goes."),
    Cause.REGRESSION: CauseWords(
        title="Step time regression",
        reason="the job's step time rose above its recent best",
        explanation="The job's step time rose above its recent best.",
        advice="Compare with the last good period: what changed in the code, the data, library "
               "versions or the nodes the job runs on when the step time rose?"),
    Cause.HANG: CauseWords(
        title="Hang",
        reason="it never reached the pending collective",
        explanation="{who} never reached the pending collective; the others are stuck waiting.",
        advice="Dump the stacks of the named ranks (py-spy dump --pid ...) to see where they "
               "stopped; the other ranks are only waiting for them."),
    Cause.SLOW_FUNCTION: CauseWords(
        title="Slow function",
        reason="a Python function is slow",
        explanation="A function on {who} takes longer than on its peers.",
        advice="Profile that function on the named rank and on a healthy peer (py-spy or the "
               "PyTorch profiler): look for different inputs, code paths or environment."),
}

# Causes that can describe how a job is built rather than a fault that happened to it: a
# pipeline whose stages are unevenly loaded, every rank spending a large share of its step in
# one place. Seen before the job has a steady state to compare against, such a finding is the
# job's shape: true from its first windows to its last, nothing on-call can act on at 3 a.m.
# It goes out as advice (``Anomaly.kind`` "advice", :data:`.vocabulary.Kind.ADVICE`): stored,
# shown by `diagnose`, the report and the dashboards, never an incident (no page, not counted
# as one by the benchmarks, no step time of a later regression explained by it). Seen first
# once the job has a steady state, it is a change and an incident like any other. Decisions
# table, docs/detection.md: "shape is advice, a change is an incident".
SHAPE: frozenset[Cause] = frozenset({Cause.STAGE_IMBALANCE, Cause.SHARED_INEFFICIENCY})
