"""Runs the real three stages (the classes the Faust agents call) on a simulated clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from perftracker.streams.detect import (
    DetectionPolicy,
    FunctionComparator,
    JobDiagnoser,
    RankSummarizer,
)


@dataclass
class Pipeline:
    """Stage 2 + 3 (and stage 1 when fed events) for one job."""

    job: str
    policy: DetectionPolicy
    summarizers: dict[int, RankSummarizer] = field(default_factory=dict)
    comparators: dict[str, FunctionComparator] = field(default_factory=dict)
    diagnoser: JobDiagnoser | None = None
    anomalies: list[tuple[int, dict]] = field(default_factory=list)  # (caller ms, record)
    controls: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.diagnoser = JobDiagnoser(self.job, self.policy)

    def add_events(self, batch: dict, now_ms: int) -> None:
        r = int(batch["rank"])
        if r not in self.summarizers:
            self.summarizers[r] = RankSummarizer(self.job, r, self.policy)
        self.summarizers[r].add_events(batch)

    def add_hardware(self, hw: dict) -> None:
        r = int(hw["rank"])
        if r not in self.summarizers:
            self.summarizers[r] = RankSummarizer(self.job, r, self.policy)
        self.summarizers[r].add_hardware(hw)

    def add_records(self, records: list[tuple[str, dict]], now_ms: int) -> None:
        """Route stage-1 output: patterns to comparators, RankWindows to the diagnoser."""
        assert self.diagnoser is not None
        for name, rec in records:
            if name == "FunctionPattern":
                fn = rec["function"]
                c = self.comparators.get(fn)
                if c is None:
                    c = self.comparators[fn] = FunctionComparator(self.job, fn, self.policy)
                c.add(rec, now_ms)
            else:
                self.diagnoser.add(name, rec, now_ms)

    def tick(self, now_ms: int) -> list[dict]:
        """Poll every stage once, in order; new Anomaly records."""
        assert self.diagnoser is not None
        for s in self.summarizers.values():
            self.add_records(s.poll(now_ms), now_ms)
        for c in self.comparators.values():
            for rec in c.poll(now_ms):
                self.diagnoser.add("FunctionComparison", rec, now_ms)
        anomalies, controls = self.diagnoser.poll(now_ms)
        self.anomalies += [(now_ms, a) for a in anomalies]
        self.controls += controls
        return anomalies
