"""The Kafka topics perftracker uses, with their keys and partition counts.

Every topic is created explicitly at start-up (tansu auto-creates unknown
topics with 4 partitions and forgets all topics on restart, and a production
cluster may forbid auto-creation).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str  # what the messages are keyed by
    doc: str


def all_topics(prefix: str = "pt", partitions: int = 8) -> list[Topic]:
    """Topic set for one deployment; ``prefix`` lets several stacks share a cluster."""
    p = partitions
    return [
        Topic(f"{prefix}.events", p, "job|rank", "EventBatch from collectors"),
        Topic(f"{prefix}.hardware", p, "job|rank", "HardwareBatch (NVML) from collectors"),
        Topic(f"{prefix}.patterns", p, "job|function", "FunctionPattern per window, rank, function"),
        Topic(f"{prefix}.findings", p, "job", "RankWindow and per-function comparisons per window"),
        Topic(f"{prefix}.anomalies", p, "job", "Anomaly: diagnosed root causes and their lifecycle"),
        Topic(f"{prefix}.control", 1, "job", "Control: profiling requests to collectors"),
        Topic(f"{prefix}.deadletter", 1, "source topic", "undecodable messages with the reason"),
    ]


@dataclass(frozen=True)
class TopicNames:
    events: str
    hardware: str
    patterns: str
    findings: str
    anomalies: str
    control: str
    deadletter: str

    @classmethod
    def for_prefix(cls, prefix: str = "pt") -> TopicNames:
        return cls(*(f"{prefix}.{n}" for n in (
            "events", "hardware", "patterns", "findings", "anomalies", "control", "deadletter")))
