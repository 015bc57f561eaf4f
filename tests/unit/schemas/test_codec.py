"""Codec: round trips, evolution in both directions, and bad bytes."""

from __future__ import annotations

import array
from datetime import datetime, timezone

import numpy as np
import pytest
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, MultiCodec, SchemaError, bundled_schemas
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.vocabulary import (
    ANOMALY,
    CONTROL,
    EVENT_BATCH,
    EVENT_BATCH_VERSION,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
)

V7 = bundled_schemas().restricted(EVENT_BATCH, 7)  # the last EventBatch with list columns


def event_batch() -> dict:
    _, record = next(iter(batches(SyntheticJob("job-1", ranks=2, seconds=2))))
    return record


def test_event_batch_round_trip_keeps_every_column():
    codec = Codec(EVENT_BATCH)
    record = event_batch()
    decoded = as_lists(codec.decode(codec.encode(record)))
    assert decoded["spans"] == record["spans"]
    assert decoded["comms"] == record["comms"]
    assert decoded["iterations"] == record["iterations"]
    assert decoded["names"] == record["names"] and decoded["schema_version"] == codec.version


def test_single_object_header_carries_writer_fingerprint():
    codec = Codec(EVENT_BATCH)
    data = codec.encode(event_batch())
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.writer.fingerprint


def test_old_reader_reads_record_with_new_optional_field():
    new = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 2))  # the v1 -> v2 step
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 1))
    assert (new.version, old.version) == (2, 1)
    record = event_batch()
    record["kernels"] = [{"kind": 0, "name": 0, "profile_id": "p1", "count": 3, "total_ns": 30,
                          "p50_ns": 10, "p99_ns": 12, "max_ns": 12, "bytes": 0}]
    decoded = old.decode(new.encode(record))
    assert "kernels" not in decoded
    assert decoded["spans"] == record["spans"] and decoded["rank"] == record["rank"]


def test_new_reader_fills_default_for_field_missing_in_old_record():
    new = Codec(EVENT_BATCH)
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 1))
    decoded = new.decode(old.encode(event_batch()))
    assert decoded["kernels"] == [] and decoded["schema_version"] == 1


CPU = {"interval_ns": 10**9, "thread_cpu_ns": 9 * 10**8, "runqueue_wait_ns": 5 * 10**7,
       "voluntary_switches": 3, "involuntary_switches": 40, "major_faults": 0, "load1": 3.5,
       "steal_pct": 0.0, "cpus": 16, "stack_samples": 25, "stack_hz": 25.0}


def _with_cpu(record: dict) -> dict:
    names = list(record["names"]) + ["train.py step"]
    return {**record, "names": names, "cpu": [CPU],
            "stacks": {"frame": [len(names) - 1], "line": [88], "kind": [1], "count": [25], "code": [-1]}}


@pytest.mark.parametrize("old_version", [1, 2])
def test_v3_cpu_and_stacks_read_by_old_readers_and_defaulted_for_new(old_version):
    new = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 3))
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, old_version))
    assert new.version == 3
    record = _with_cpu(event_batch())
    decoded = new.decode(new.encode(record))
    assert decoded["cpu"] == [CPU] and decoded["stacks"] == record["stacks"]
    by_old = old.decode(new.encode(record))
    assert "cpu" not in by_old and "stacks" not in by_old and by_old["spans"] == record["spans"]
    from_old = new.decode(old.encode(event_batch()))
    assert from_old["cpu"] == [] and from_old["stacks"] == {"frame": [], "line": [], "kind": [], "count": [], "code": []}


@pytest.mark.parametrize("old_version", [1, 2, 3])
def test_v4_final_flag_read_by_old_readers_and_defaulted_for_new(old_version):
    new = Codec(EVENT_BATCH, V7)  # v8 retyped the columns: no reader before it reads v8
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, old_version))
    assert new.version == 7
    record = {**_with_cpu(event_batch()), "final": True}
    assert new.decode(new.encode(record))["final"] is True
    assert new.decode(new.encode(event_batch()))["final"] is False  # the default when left out
    by_old = old.decode(new.encode(record))
    assert "final" not in by_old and by_old["spans"] == record["spans"] and by_old["seq"] == record["seq"]
    from_old = new.decode(old.encode(event_batch()))
    assert from_old["final"] is False and from_old["iterations"] == event_batch()["iterations"]


MINOR = {"rank": 2, "host": "h2", "gpu": 0, "peer_group": "s", "value_ms_per_step": 1.2, "peer_median_ms_per_step": 0.4,
         "ratio": 3.0, "robust_z": 30.0, "cost_ms_per_step": 0.8, "calls_ratio": 4.0, "per_call_ratio": 0.75,
         "intermittent": False}  # FunctionComparison v2: an excess short of the cost a finding needs
STALL = {"rank": 1, "host": "h1", "gpu": -1, "seq": 480, "wait_ms": 512.5, "seqs_per_step": 2.0}  # v3


@pytest.mark.parametrize("name, field, value, default, old_version", [
    (RANK_WINDOW, "ended_cleanly", True, False, 2),
    (RANK_WINDOW, "restarts", 2, 0, 2),
    (RANK_WINDOW, "mesh_coords", {"dp": 1, "tp": 0}, {}, 3),
    (ANOMALY, "resolved_reason", "job finished", "", 1),
    (FUNCTION_PATTERN, "mesh_coords", {"pp": 1, "tp": 0}, {}, 1),
    (FUNCTION_PATTERN, "hist_first", 9, 0, 2),
    (FUNCTION_PATTERN, "hist_counts", [1, 0, 2], [], 2),
    (FUNCTION_COMPARISON, "minor_outliers", [MINOR], [], 1),
    (FUNCTION_COMPARISON, "stalls", [STALL], [], 2),
])
def test_appended_job_end_fields_round_trip_old_and_new(name, field, value, default, old_version):
    from perftracker_ml.deploy.workloads.store_records import (
        anomaly,
        comparison,
        pattern,
        rank_window,
    )

    base = {RANK_WINDOW: lambda: rank_window("j", 3, 1), ANOMALY: lambda: anomaly("j", "i1"),
            FUNCTION_PATTERN: lambda: pattern("j", 3, 1, "f"),
            FUNCTION_COMPARISON: lambda: comparison("j", 1, 4, 2, function="kind:backward")}[name]()
    base = {k: v for k, v in base.items() if k not in (field, "schema_version")}
    new = Codec(name)
    old = Codec(name, bundled_schemas().restricted(name, old_version))
    assert new.decode(new.encode({**base, field: value}))[field] == value
    assert field not in old.decode(new.encode({**base, field: value}))
    assert new.decode(old.encode(base))[field] == default


def test_v3_trimmed_histogram_is_no_histogram_to_a_v2_reader_and_the_whole_one_to_every_reader():
    """FunctionPattern v3 sends ``hist`` empty and the histogram as ``hist_first`` + ``hist_counts``:
    a v2 reader (an older sink) sees no histogram, never one shifted to bucket 0; the whole
    histogram (:func:`full_histogram`) of a v3 pattern and of a v2 one is the same list."""
    from perftracker_ml.deploy.workloads.store_records import pattern
    from perftracker_ml.schemas.records import full_histogram

    whole = [0] * 9 + [1] + [0] * 69 + [2]
    base = {k: v for k, v in pattern("j", 3, 1, "f").items() if k != "schema_version"}
    new = Codec(FUNCTION_PATTERN)
    old = Codec(FUNCTION_PATTERN, bundled_schemas().restricted(FUNCTION_PATTERN, 2))
    v3 = {**base, "hist": [], "hist_first": 9, "hist_counts": whole[9:]}
    assert old.decode(new.encode(v3))["hist"] == []
    assert full_histogram(new.decode(new.encode(v3))) == whole
    assert full_histogram(new.decode(old.encode({**base, "hist": whole}))) == whole
    assert len(new.encode(v3)) < len(old.encode({**base, "hist": whole}))


@pytest.mark.parametrize("old_version", [3, 4])
def test_v5_mesh_coords_read_by_old_readers_and_defaulted_for_new(old_version):
    new = Codec(EVENT_BATCH, V7)
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, old_version))
    assert new.version == 7
    record = {**_with_cpu(event_batch()), "mesh_coords": {"dp": 1, "tp": 0}}
    assert new.decode(new.encode(record))["mesh_coords"] == {"dp": 1, "tp": 0}
    assert new.decode(new.encode(event_batch()))["mesh_coords"] == {}  # the default when left out
    by_old = old.decode(new.encode(record))
    assert "mesh_coords" not in by_old and by_old["spans"] == record["spans"]
    assert new.decode(old.encode(event_batch()))["mesh_coords"] == {}


@pytest.mark.parametrize("data, fragment", [
    (b"", "not an Avro single-object"),
    (b"garbage bytes that are not avro", "not an Avro single-object"),
    (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "unknown schema fingerprint"),
])
def test_garbage_is_a_schema_error_naming_the_problem(data, fragment):
    with pytest.raises(SchemaError, match=fragment):
        Codec(EVENT_BATCH).decode(data)


def test_truncated_body_is_a_schema_error():
    data = Codec(EVENT_BATCH).encode(event_batch())
    with pytest.raises(SchemaError, match="corrupt EventBatch"):
        Codec(EVENT_BATCH).decode(data[: len(data) // 2])


def test_record_of_another_type_is_refused():
    control = Codec(CONTROL).encode({"job": "j", "request_id": "r", "command": "PROFILE", "start_step": 3,
                                     "duration_s": 5.0, "reason": "test",
                                     "issued_ms": datetime.now(timezone.utc)})
    with pytest.raises(SchemaError, match="holds a Control record"):
        Codec(EVENT_BATCH).decode(control)


def test_record_not_matching_schema_names_the_record():
    with pytest.raises(SchemaError, match="EventBatch record does not match"):
        Codec(EVENT_BATCH).encode({"job": "j"})


def test_multicodec_dispatches_on_fingerprint():
    multi = MultiCodec([EVENT_BATCH, ANOMALY])
    name, record = multi.decode(Codec(EVENT_BATCH).encode(event_batch()))
    assert name == EVENT_BATCH and record["job"] == "job-1"
    with pytest.raises(SchemaError):
        multi.decode(Codec(CONTROL).encode({"job": "j", "request_id": "r", "command": "PING", "start_step": 0,
                                            "duration_s": 0.0, "reason": "",
                                            "issued_ms": datetime.now(timezone.utc)}))


FLIGHT = {"process_group": "0", "pg_desc": "default_pg", "seq": 2, "op": "nccl:all_reduce", "state": "scheduled",
          "age_ms": 31000, "timeout_ms": 600000, "last_completed_seq": 1, "last_enqueued_seq": 2}


@pytest.mark.parametrize("old_version", [4, 5])
def test_v6_flight_records_read_by_old_readers_and_defaulted_for_new(old_version):
    new = Codec(EVENT_BATCH, V7)
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, old_version))
    assert new.version == 7
    record = {**_with_cpu(event_batch()), "flight_records": [FLIGHT]}
    assert new.decode(new.encode(record))["flight_records"] == [FLIGHT]
    assert new.decode(new.encode(event_batch()))["flight_records"] == []
    assert "flight_records" not in old.decode(new.encode(record))
    assert new.decode(old.encode(event_batch()))["flight_records"] == []


def test_every_bundled_schema_has_schema_version_first():
    schemas = bundled_schemas()
    for name in schemas.names():
        assert schemas.latest(name).raw["fields"][0]["name"] == "schema_version", name


PACKED_WIDTHS = {"iterations": ("<i8", "<i8", "<i8"), "spans": ("<i4", "<i4", "<i4", "<i8", "<i8", "<i8"),
                 "comms": ("<i4", "<i4", "<i8", "<i8", "<i8", "<i8", "<i8"),
                 "stacks": ("<i4", "<i4", "<i4", "<i8", "<i4")}


def test_v8_columns_round_trip_as_little_endian_arrays():
    codec = Codec(EVENT_BATCH)
    assert codec.version == EVENT_BATCH_VERSION >= 8  # v8 packed the columns; later versions keep them packed
    record = _with_cpu(event_batch())
    data = codec.encode(record)
    decoded = codec.decode(data)
    for block, widths in PACKED_WIDTHS.items():
        for (col, values), width in zip(decoded[block].items(), widths, strict=True):
            assert isinstance(values, np.ndarray) and values.dtype == np.dtype(width), (block, col)
            assert values.tolist() == record[block][col], (block, col)
    assert decoded["schema_version"] == EVENT_BATCH_VERSION and decoded["names"] == record["names"]
    assert decoded["cpu"] == [CPU]
    # on the wire: one Avro bytes per column, the values packed (spans.start_ns of the record here)
    assert np.array(record["spans"]["start_ns"], "<i8").tobytes() in data
    again = codec.encode(decoded)  # arrays pack back to the same bytes
    assert again == data and codec.encode({**record, "stacks": as_lists(decoded)["stacks"]}) == data


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7])
def test_every_older_version_still_decodes_with_list_columns(version):
    old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, version))
    record = _with_cpu(event_batch()) if version >= 3 else event_batch()
    decoded = Codec(EVENT_BATCH).decode(old.encode(record))
    assert decoded["schema_version"] == version
    for block in ("spans", "comms", "iterations"):
        assert decoded[block] == record[block]  # lists, as before v8
    empty = {k: [] for k in ("frame", "line", "kind", "count", "code")}
    assert decoded["stacks"] == (record["stacks"] if version >= 3 else empty)
    assert decoded["net"] == [] and decoded["final"] is False


def test_v8_packs_lists_stdlib_arrays_and_numpy_arrays_alike():
    codec = Codec(EVENT_BATCH)
    record = event_batch()
    as_arrays = {**record, "spans": {k: np.asarray(v) for k, v in record["spans"].items()},
                 "comms": {k: array.array("q", v) for k, v in record["comms"].items()}}
    assert codec.encode(as_arrays) == codec.encode(record)


@pytest.mark.parametrize("block, column, value", [("spans", "kind", 2**31), ("spans", "name", -(2**31) - 1),
                                                  ("comms", "seq", 2**63)])
def test_a_value_past_its_column_width_is_a_schema_error(block, column, value):
    record = event_batch()
    record[block][column][0] = value
    with pytest.raises(SchemaError, match="EventBatch record does not match"):
        Codec(EVENT_BATCH).encode(record)
    with pytest.raises(SchemaError, match="EventBatch record does not match"):
        Codec(EVENT_BATCH).encode({**record, block: {k: np.asarray(v, object if k == column else None)
                                                     for k, v in record[block].items()}})


def test_v9_members_as_a_range_round_trip_and_older_writers_list_them():
    """EventBatch v9: a group's equally spaced members as (first, step, count). A v9 reader reads a
    v8 body's listed groups (the range fields default to 0); a v8 or v7 writer lists a range's
    members (it has no fields for a range: sent as they are, the group would arrive without
    members); a v8 reader refuses a v9 body (the rollout upgrades the workers first)."""
    from perftracker_ml.schemas.records import group_members

    ranged = {"group_id": "pgdp-4-y", "ranks": [], "ranks_first": 1, "ranks_step": 8, "ranks_count": 4}
    listed = {"group_id": "pgodd-3-z", "ranks": [0, 1, 5]}
    record = {**event_batch(), "world_size": 32, "groups": [ranged, listed]}
    record["comms"] = {**record["comms"], "group": [0] * len(record["comms"]["group"])}
    new = Codec(EVENT_BATCH)
    v9 = new.decode(new.encode(record))
    assert v9["groups"][0] == ranged and [group_members(g) for g in v9["groups"]] == [[1, 9, 17, 25], [0, 1, 5]]
    for version in (8, 7):
        old = Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, version))
        body = old.encode(record)
        assert [g["ranks"] for g in old.decode(body)["groups"]] == [[1, 9, 17, 25], [0, 1, 5]]
        assert [group_members(g) for g in new.decode(body)["groups"]] == [[1, 9, 17, 25], [0, 1, 5]]
        assert record["groups"][0] is ranged and ranged["ranks"] == []  # the caller's record is not changed
    with pytest.raises(SchemaError, match="v9 body could not be read with v8"):
        Codec(EVENT_BATCH, bundled_schemas().restricted(EVENT_BATCH, 8)).decode(new.encode(record))


def test_v3_pattern_members_as_a_range_and_a_v2_writer_lists_them_and_the_whole_histogram():
    """FunctionPattern v3: a collective's equally spaced group as (first, step, count) and the
    histogram trimmed. A v2 writer (a worker pinned to an older pattern version) has no fields for
    either: it sends the members listed and the histogram whole, so nothing is lost."""
    from perftracker_ml.deploy.workloads.store_records import pattern
    from perftracker_ml.schemas.records import full_histogram, group_members

    base = {k: v for k, v in pattern("j", 3, 1, "comm:all_reduce:pgdp", world=64).items() if k != "schema_version"}
    v3 = {**base, "group_ranks": [], "group_ranks_first": 1, "group_ranks_step": 8, "group_ranks_count": 8,
          "hist": [], "hist_first": 9, "hist_counts": [1, 0, 2]}
    new = Codec(FUNCTION_PATTERN)
    old = Codec(FUNCTION_PATTERN, bundled_schemas().restricted(FUNCTION_PATTERN, 2))
    read = new.decode(new.encode(v3))
    assert read["group_ranks"] == [] and group_members(read, "group_ranks") == list(range(1, 64, 8))
    as_v2 = old.decode(old.encode(v3))
    assert as_v2["group_ranks"] == list(range(1, 64, 8)) and as_v2["hist"] == [0] * 9 + [1, 0, 2]
    assert group_members(new.decode(old.encode(v3)), "group_ranks") == list(range(1, 64, 8))
    assert full_histogram(new.decode(old.encode(v3))) == full_histogram(read) == [0] * 9 + [1, 0, 2]
    assert v3["group_ranks"] == [] and v3["hist"] == []  # the caller's record is not changed
