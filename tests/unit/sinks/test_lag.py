"""The sink's consumer lag: cached high watermark minus position, clamped, no broker call."""

from __future__ import annotations

from perftracker_ml.sinks.lag import consumer_lag


class TP:
    def __init__(self, topic: str, partition: int, offset: int = -1001):
        self.topic, self.partition, self.offset = topic, partition, offset


class FakeConsumer:
    def __init__(self) -> None:
        self.positions = [TP("pt.findings", 0, 10), TP("pt.findings", 1, 20), TP("pt.anomalies", 0),
                          TP("pt.patterns", 3, 5), TP("pt.patterns", 4, 5)]
        self.watermarks = {("pt.findings", 0): (0, 25), ("pt.findings", 1): (0, 12),
                           ("pt.patterns", 3): (-1001, -1001), ("pt.patterns", 4): None}
        self.cached: list[bool] = []

    def assignment(self) -> list[TP]:
        return [TP(t.topic, t.partition) for t in self.positions]

    def position(self, tps: list[TP]) -> list[TP]:
        return self.positions

    def get_watermark_offsets(self, tp: TP, cached: bool = False) -> tuple[int, int] | None:
        self.cached.append(cached)
        return self.watermarks.get((tp.topic, tp.partition))


def test_lag_per_partition():
    consumer = FakeConsumer()
    assert consumer_lag(consumer) == {("pt.findings", "0"): 15, ("pt.findings", "1"): 0}
    assert consumer.cached and all(consumer.cached)
