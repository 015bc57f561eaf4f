"""Consumer lag per partition, from what the consumer saw (the sink's ``consumer_lag`` gauge).

Per assigned partition: the high watermark of the consumer's last fetch
(confluent-kafka's cached watermark, no broker call) minus its position (the
next offset to read), clamped at 0. The broker's end offsets (ListOffsets)
are not used: tansu reports them too low (docs/background.md).
"""

from __future__ import annotations

from typing import Any


def consumer_lag(consumer: Any) -> dict[tuple[str, ...], int]:
    """(topic, partition) -> lag of a confluent-kafka consumer's assigned partitions; a
    partition not read or not fetched yet has none."""
    lags: dict[tuple[str, ...], int] = {}
    for tp in consumer.position(consumer.assignment()):
        if tp.offset < 0:  # nothing read yet: no position
            continue
        watermarks = consumer.get_watermark_offsets(tp, cached=True)  # (low, high) or None
        if not watermarks or watermarks[1] < 0:  # never fetched
            continue
        lags[(tp.topic, str(tp.partition))] = max(0, watermarks[1] - tp.offset)
    return lags
