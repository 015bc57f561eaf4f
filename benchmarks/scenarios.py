"""The labelled scenario suite of the detection benchmark.

Every scenario names its layout, injected faults (with magnitudes and positions), noise,
and ground truth: the cause class and the culprit ranks the engine must report, or
nothing. Small 4- and 16-rank data-parallel jobs (the live demo's faults) run through all
three stages from EventBatch dicts; larger data x tensor x pipeline layouts, up to 16,384
ranks, are simulated as FunctionPattern/RankWindow records and run through stages 2 and 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from perftracker_ml.deploy.workloads.simulate.faults import Fault, Truth
from perftracker_ml.deploy.workloads.simulate.layout import Layout


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    layout: Layout | None = None  # None: event-level job
    faults: tuple[Fault, ...] = ()
    truths: tuple[Truth, ...] = ()
    seed: int = 0
    moe: bool = False
    windows: int = 12
    spike_prob: float = 0.3
    event_fault: str = ""  # event-level: slow-dataloader | cpu-contention | slow-collective | gc-storm | none
    event_ranks: int = 4
    magnitude: float = 0.0
    tags: tuple[str, ...] = field(default_factory=tuple)


def _rank_fault(family: str, layout: Layout, rank: int, mag: float, **kw) -> tuple[Fault, Truth]:
    f = Fault(family, (rank,), magnitude=mag, **kw)
    return f, Truth(_cause(family), (rank,), f.start_window)


def _cause(family: str) -> str:
    from perftracker_ml.deploy.workloads.simulate.faults import TRUE_CAUSE
    return TRUE_CAUSE[family]


def pattern_scenarios(include_16k: bool = True, seed_offset: int = 0) -> list[Scenario]:
    """``seed_offset`` re-draws fault positions and noise (the default suite is offset 0)."""
    rng = np.random.default_rng(2024 + seed_offset)
    out: list[Scenario] = []
    seed = iter(range(1000 + 1000 * seed_offset, 2000 + 1000 * seed_offset))

    def add(name: str, family: str, layout: Layout, faults, truths, **kw):
        out.append(Scenario(name, family, layout, tuple(faults), tuple(truths), next(seed), **kw))

    def pick(layout: Layout) -> int:
        return int(rng.integers(layout.ranks))

    for fam, mags in (("slow_gpu", (1.15, 1.3, 2.0)), ("gpu_throttle", (1.2, 1.5))):
        for mag, lay in zip(mags, (Layout(32, 1, 1), Layout(16, 4, 2), Layout(64, 8, 2)), strict=False):
            f, t = _rank_fault(fam, lay, pick(lay), mag)
            add(f"{fam}-{mag}x-{lay.ranks}r", fam, lay, [f], [t], magnitude=mag)
    for mag, hw, lay in ((2.0, True, Layout(16, 2, 2)), (4.0, True, Layout(32, 4, 1)),
                         (2.5, False, Layout(16, 2, 4)), (3.0, False, Layout(8, 4, 2))):
        f, t = _rank_fault("slow_link", lay, pick(lay), mag, hw_evidence=hw)
        add(f"slow_link-{mag}x-{'hw' if hw else 'nohw'}-{lay.ranks}r", "slow_link", lay, [f], [t], magnitude=mag)
    for mag, lay in ((1.3, Layout(32, 2, 1)), (1.6, Layout(16, 4, 2)), (2.0, Layout(64, 8, 2))):
        host = int(rng.integers(lay.ranks // 8))
        ranks = tuple(lay.ranks_of_host(host))
        f = Fault("cpu_contention", ranks, magnitude=mag)
        add(f"cpu_contention-{mag}x-host{host}-{lay.ranks}r", "cpu_contention", lay, [f],
            [Truth("host_cpu_contention", ranks, f.start_window)], magnitude=mag)
    for fam, mags in (("slow_dataloader", (30.0, 100.0, 15.0)), ("gc_pause", (20.0, 60.0, 12.0))):
        for mag, lay in zip(mags, (Layout(32, 1, 1), Layout(16, 4, 2), Layout(64, 8, 2)), strict=False):
            f, t = _rank_fault(fam, lay, pick(lay), mag)
            add(f"{fam}-{mag:.0f}ms-{lay.ranks}r", fam, lay, [f], [t], magnitude=mag)
    for fam, mag in (("shared_gc", 40.0), ("shared_dataloader", 120.0), ("shared_python", 80.0)):
        lay = Layout(32, 2, 2)
        f = Fault(fam, (), magnitude=mag)
        add(f"{fam}-{mag:.0f}ms-{lay.ranks}r", fam, lay, [f], [Truth("shared_inefficiency", (), f.start_window)])
    for stage, mag, lay in ((0, 1.3, Layout(8, 2, 4)), (3, 1.5, Layout(8, 2, 4)), (1, 1.4, Layout(4, 4, 2))):
        f = Fault("stage_imbalance", (), stage=stage, magnitude=mag)
        add(f"stage_imbalance-s{stage}-{mag}x-{lay.ranks}r", "stage_imbalance", lay, [f],
            [Truth("stage_imbalance", tuple(lay.ranks_of_stage(stage)), f.start_window)], magnitude=mag)
    for mag, lay, k in ((1.5, Layout(32, 1, 1), 2), (2.0, Layout(64, 2, 1), 3)):
        ranks = tuple(sorted(int(r) for r in rng.choice(lay.ranks, k, replace=False)))
        f = Fault("data_imbalance", ranks, magnitude=mag)
        add(f"data_imbalance-{mag}x-{k}ranks-{lay.ranks}r", "data_imbalance", lay, [f],
            [Truth("data_imbalance", ranks, f.start_window)], moe=True, magnitude=mag)
    for lay in (Layout(32, 1, 1), Layout(16, 4, 2)):
        add(f"spikes-{lay.ranks}r", "spike", lay, [], [], spike_prob=0.6)
    for lay in (Layout(32, 1, 1), Layout(16, 2, 2)):
        f = Fault("creep", (), magnitude=1.0, end_window=12)
        add(f"creep-{lay.ranks}r", "creep", lay, [f], [Truth("regression", (), f.start_window)])
    for lay in (Layout(64, 1, 1), Layout(8, 4, 2), Layout(16, 2, 4)):
        f = Fault("hang", (pick(lay),), end_window=99)
        add(f"hang-{lay.ranks}r", "hang", lay, [f], [Truth("hang", f.ranks, f.start_window)], windows=14)
    for lay in (Layout(32, 2, 1), Layout(64, 8, 2)):
        r1, r2 = pick(lay), pick(lay)
        while lay.host_of(r2) == lay.host_of(r1):
            r2 = pick(lay)
        f1, t1 = _rank_fault("slow_gpu", lay, r1, 1.4)
        f2, t2 = _rank_fault("slow_dataloader", lay, r2, 60.0)
        add(f"two_culprits-{lay.ranks}r", "two_culprits", lay, [f1, f2], [t1, t2])
    add("none-1024r", "none", Layout(64, 8, 2), [], [])
    if include_16k:
        add("none-16384r", "none", Layout(256, 8, 8), [], [], windows=5)
        lay = Layout(256, 8, 8)
        f, t = _rank_fault("slow_gpu", lay, pick(lay), 1.3, start_window=2)
        add("slow_gpu-1.3x-16384r", "slow_gpu", lay, [f], [t], windows=6, magnitude=1.3)
    return out


EVENT_TRUTH = {"slow-dataloader": "slow_dataloader", "cpu-contention": "host_cpu_contention",
               "slow-collective": "slow_function", "gc-storm": "gc_pause"}


def event_scenarios(seed_offset: int = 0) -> list[Scenario]:
    """The live demo's faults on a 4-rank (and a 16-rank) data-parallel CPU job."""
    out = []
    n = 1000 * seed_offset
    for ranks in (4, 16):
        for fault, mag in (("slow-dataloader", 10.0), ("cpu-contention", 12.0), ("slow-collective", 10.0),
                           ("gc-storm", 10.0), ("none", 0.0)):
            culprit = 2 if ranks == 4 else 11
            truth = (Truth(EVENT_TRUTH[fault], (culprit,), 3),) if fault != "none" else ()
            out.append(Scenario(f"events-{fault}-{ranks}r", f"events:{fault}", None, (), truth, 500 + n,
                                event_fault=fault, event_ranks=ranks, magnitude=mag, windows=12))
            n += 1
    return out


def stress_scenarios() -> list[Scenario]:
    """Beyond the reference suite: cases at or past the engine's documented limits
    (docs/detection.md, "Known failure cases"). Reported separately, not in the score."""
    out = []
    lay = Layout(32, 1, 1)

    def one(name, family, layout, fault, truth):
        out.append(Scenario(name, family, layout, (fault,), (truth,), 3000 + len(out)))

    f = Fault("slow_gpu", (9,), magnitude=1.08)
    one("stress-slow_gpu-1.08x", "slow_gpu", lay, f, Truth("slow_gpu", (9,), f.start_window))
    f = Fault("slow_dataloader", (9,), magnitude=90.0, every=3)
    one("stress-intermittent-dataloader-1in3", "slow_dataloader", lay, f, Truth("slow_dataloader", (9,), 4))
    f = Fault("slow_dataloader", (9,), magnitude=4.0)
    one("stress-slow_dataloader-4ms", "slow_dataloader", lay, f, Truth("slow_dataloader", (9,), 4))
    f = Fault("slow_link", (9,), magnitude=3.0, hw_evidence=False)
    one("stress-slow_link-dp-only-nohw", "slow_link", Layout(64, 1, 1), f, Truth("slow_link", (9,), 4))
    f = Fault("slow_link", (9,), magnitude=3.0, hw_evidence=False)
    one("stress-slow_link-tp-nohw-nopp", "slow_link", Layout(16, 4, 1), f, Truth("slow_link", (9,), 4))
    ranks = tuple(range(8, 16))
    f = Fault("cpu_contention", ranks, magnitude=1.5)
    one("stress-cpu_contention-half-of-job", "cpu_contention", Layout(16, 1, 1), f,
        Truth("host_cpu_contention", ranks, 4))
    return out
