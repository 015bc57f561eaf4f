"""The sink's handling of a RecordBundle with nothing in it (the workers never send one): the
message counts as handled, so its offset is committed with the rest and not re-read after a
restart. (Bundles with records: tests/integration/sinks/test_service.py, against tansu and chDB.)"""

from __future__ import annotations

from perftracker_ml.schemas import bundle
from perftracker_ml.schemas.settings import Settings
from perftracker_ml.sinks.service import SinkService


def test_an_empty_bundle_is_handled_and_its_offset_recorded():
    service = SinkService(Settings(), dispatcher=object())  # type: ignore[arg-type]
    service.handle("pt.findings", 3, 41, bundle.pack([]))
    assert service._offsets == {("pt.findings", 3): 41}
    assert service.stats.dead_lettered == 0
