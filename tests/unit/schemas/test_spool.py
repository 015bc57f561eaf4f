"""The spool (``spool:DIR``): collectors' messages in local files, turned into a recording.

Format round trips and refusals, the collector's sink (counted deliveries, the size bound),
and a real recorded job written to a spool then recorded from it: its replay names the same
incidents as the original's.
"""

from __future__ import annotations

import struct

import pytest
from perftracker_ml.collectors.counters import CollectorCounters
from perftracker_ml.collectors.safety import ErrorBudget
from perftracker_ml.collectors.transport import SpoolSink
from perftracker_ml.deploy.record import RecordError, record_spool
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.schemas.spool import (
    MAGIC,
    SpoolError,
    SpoolReading,
    SpoolWriter,
    read_spool,
    spool_dir,
)
from perftracker_ml.streams.replay import replay


def test_a_spool_bootstrap_names_its_directory(tmp_path):
    assert spool_dir(f"spool:{tmp_path}") == tmp_path and spool_dir("broker:9092") is None


def test_frames_round_trip_in_file_order_and_a_cut_frame_ends_the_file(tmp_path):
    w = SpoolWriter(tmp_path)
    assert w.append("pt.events", b"j|0", b"one", 10) and w.append("pt.hardware", None, b"", 11)
    w.close()
    with open(w.path, "ab") as f:  # the process was killed mid-write
        f.write(struct.pack(">HIIq", 9, 3, 100, 12) + b"pt.events")
    reading = SpoolReading()
    got = [(m.topic, m.key, m.value, m.timestamp_ms, m.index) for m in read_spool(tmp_path, reading)]
    assert got == [("pt.events", b"j|0", b"one", 10, 0), ("pt.hardware", None, b"", 11, 1)]
    assert (reading.files, reading.frames, reading.cut) == (1, 2, 1)


def test_a_file_that_is_not_a_spool_and_a_missing_directory_are_refused_by_name(tmp_path):
    (tmp_path / "x.spool").write_bytes(b"hello")
    with pytest.raises(SpoolError, match="not a perftracker spool file"):
        list(read_spool(tmp_path))
    with pytest.raises(SpoolError, match="no such spool directory"):
        list(read_spool(tmp_path / "nope"))


def test_the_sink_counts_what_it_writes_and_loses_what_passes_the_bound(tmp_path):
    counters, lost = CollectorCounters(), []
    sink = SpoolSink(tmp_path, "pt.events", counters, lost.append, ErrorBudget())
    sink.writer.max_bytes = len(MAGIC) + 60
    sink.send(b"j|1", b"x" * 20, 5)
    sink.send(b"j|1", b"y" * 40, 7)  # past the bound: lost, counted
    sink.send_to("pt.hardware", b"j|1", b"h" * 40)
    assert sink.flush(1.0) == 0
    assert counters.batches_sent == 1 and counters.events_sent == 5 and counters.batches_failed == 2
    assert lost == [7]
    assert [m.value for m in read_spool(tmp_path)] == [b"x" * 20]


def test_a_recorded_job_through_a_spool_replays_to_the_same_incidents(tmp_path):
    from benchmarks.corpus import entries

    entry = next(e for e in entries() if e.truth.name == "two-culprits")
    original = list(Recording(entry.recording).messages())
    writers: dict[int, SpoolWriter] = {}
    for m in sorted(original, key=lambda m: m.order):  # one writer per partition, as one per process
        writers.setdefault(m.partition, SpoolWriter(tmp_path / "spool")).append(m.topic, m.key, m.value, m.timestamp_ms)
    for w in writers.values():
        w.close()
    job, n = record_spool(tmp_path / "spool", tmp_path / "from-spool.ptrec")
    spooled = Recording(tmp_path / "from-spool.ptrec")
    assert job == spooled.header.job == Recording(entry.recording).header.job and n == len(original)
    assert spooled.header.source == "spool"

    def found(messages):
        return sorted({(a["cause"], tuple(a["ranks"])) for a in replay(messages).anomalies})

    assert found(list(spooled.messages())) == found(original) != []


def test_record_spool_refuses_an_empty_spool_and_asks_which_of_several_jobs(tmp_path):
    from perftracker_ml.schemas import Codec
    from perftracker_ml.schemas.vocabulary import HARDWARE_BATCH

    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordError, match="no message of any job"):
        record_spool(tmp_path / "empty", tmp_path / "x.ptrec")
    w = SpoolWriter(tmp_path / "two")
    codec = Codec(HARDWARE_BATCH)
    for job in ("a", "b"):
        w.append("pt.hardware", f"{job}|0".encode(), codec.encode({
            "job": job, "rank": 0, "host": "h", "gpu": 0, "gpu_uuid": "", "seq": 0, "wall_ns": [], "sm_clock_mhz": [],
            "sm_clock_max_mhz": [], "mem_clock_mhz": [], "util_gpu_pct": [], "util_mem_pct": [], "temp_c": [],
            "power_w": [], "power_limit_w": [], "throttle_reasons": [], "pcie_gen": [], "pcie_width": [],
            "pcie_tx_kbps": [], "pcie_rx_kbps": [], "nvlink_tx_kbps": [], "nvlink_rx_kbps": [],
            "nvlink_errors": [], "ecc_uncorrected": [], "xid": []}), 1)
    w.close()
    with pytest.raises(RecordError, match="several jobs"):
        record_spool(tmp_path / "two", tmp_path / "x.ptrec")
    assert record_spool(tmp_path / "two", tmp_path / "b.ptrec", job="b") == ("b", 1)
