"""The EventBatches collectors wrote to a spool (``PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=spool:DIR``)."""

from __future__ import annotations

from pathlib import Path

from perftracker_ml.schemas import MultiCodec
from perftracker_ml.schemas.spool import read_spool
from perftracker_ml.schemas.vocabulary import EVENT_BATCH


def event_batches(directory: Path) -> list[dict]:
    """Every EventBatch in the spool ``directory`` (an absent directory: none), in file order."""
    if not directory.is_dir():
        return []
    codec = MultiCodec([EVENT_BATCH])
    return [codec.decode(m.value)[1] for m in read_spool(directory) if m.topic.endswith(".events")]
