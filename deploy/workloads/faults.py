"""The fault table: every fault perftracker's workloads can inject, and the cause it should be named with.

One row per fault (:data:`FAULTS`): what the fault does, the :class:`~perftracker_ml.schemas.causes.Cause`
a correct diagnosis names on the culprit (None: nothing should be reported — a one-off event
or noise), and whether the whole job is the culprit (a job-wide cause naming no rank). The
demo (``deploy/demo``), the fault suite of real jobs (``benchmarks``) and the corpus of recordings
(``benchmarks/``) and the tests read their expectations here; the training scripts that
inject a fault name it by the same key. Standard library and schemas only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...schemas.causes import Cause


@dataclass(frozen=True)
class FaultSpec:
    name: str
    cause: Cause | None  # what a correct diagnosis names on the culprit; None: nothing may be reported
    what: str  # what the fault does, in a few words
    job_wide: bool = False  # the cause names no rank: the whole job is slower

    @property
    def alerts(self) -> bool:
        return self.cause is not None


SF, DL = Cause.SLOW_FUNCTION, Cause.SLOW_DATALOADER
FAULTS: dict[str, FaultSpec] = {f.name: f for f in (
    FaultSpec("none", None, "no fault"),
    FaultSpec("slow-dataloader", DL, "the collate function sleeps per batch (inside DataLoader.__next__)"),
    FaultSpec("slow-loader-workers", DL, "the data loader's worker processes sleep per batch"),
    FaultSpec("gradual-creep", DL, "the data loader's delay grows from nothing over tens of seconds"),
    FaultSpec("slow-optimizer", SF, "busy CPU work inside the optimizer step"),
    FaultSpec("slow-backward-hook", SF, "busy CPU work inside a gradient hook during backward"),
    FaultSpec("slow-forward-submodule", SF, "busy CPU work inside one submodule's forward"),
    FaultSpec("slow-collective", SF, "a sleep just before the per-step all_reduce, in untimed code"),
    FaultSpec("host-copies", SF, "host-side tensor copies after each step, in untimed code"),
    FaultSpec("checkpoint", SF, "a torch.save of the model after each step"),
    FaultSpec("untimed-sleep", SF, "a sleep after each step, in code no collector times"),
    FaultSpec("periodic-stall", SF, "a synchronous flush (a blocking wait) every few seconds on one rank"),
    FaultSpec("intermittent-straggler", SF, "one step in four is several times slower"),
    FaultSpec("gil-thread", SF, "a pure-Python thread of the training process holds the GIL"),
    FaultSpec("cpu-contention", Cause.HOST_CPU_CONTENTION, "busy processes pinned to the rank's core"),
    FaultSpec("gc-storm", Cause.GC_PAUSE, "cyclic garbage and a full garbage collection every step"),
    FaultSpec("data-imbalance", Cause.DATA_IMBALANCE, "the rank gets several micro-batches per step"),
    FaultSpec("stall-before-forward", Cause.HANG, "the rank stalls in plain Python before its forward"),
    FaultSpec("subgroup-hang", Cause.HANG, "the rank stalls while its sub-group peer waits in an all_reduce"),
    FaultSpec("killed", Cause.HANG, "the rank's process is frozen (SIGSTOP): it stops reporting"),
    FaultSpec("job-wide-slowdown", Cause.REGRESSION, "every rank sleeps per step", job_wide=True),
    FaultSpec("one-off-spike", None, "one stall of 1.5 s on one rank, once"),
    FaultSpec("long-pause", None, "one pause of 12 s on one rank, shorter than a hang"),
    FaultSpec("jitter", None, "every rank's optimizer step is slower now and then, at random"),
    FaultSpec("eval-passes", None, "every rank runs an evaluation pass (forward only, no optimizer step) "
              "every few hundred steps"),
)}


def cause_of(fault: str) -> str | None:
    """The cause id a correct diagnosis of ``fault`` names (None: nothing may be reported)."""
    spec = FAULTS[fault]
    return spec.cause.value if spec.cause is not None else None
