"""Raw ingestion: high-volume records are decoded by ClickHouse, not by Python.

A message in single-object encoding is a 10-byte header and a plain Avro
datum, so the datums of many messages written with the same schema, joined,
are one block of an Avro object container file. The sink keeps those bodies
undecoded, sends one container per record type per flush (``INSERT INTO
raw_<type> FORMAT Avro``) into a ``Null`` table, and materialized views turn
the rows into the real tables in C++ (``ARRAY JOIN`` of the step times into
``iterations``, medians, renames). This is ~10x less CPU than decoding in
Python, and gives the same rows as :mod:`.rows` (a test holds both paths to it).

Only bodies written with the latest schema of a type take this path; older
versions, and every body of a container ClickHouse refuses while the store is
up, are decoded in Python (the bad ones are dead-lettered).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache

import fastavro

from ..schemas import bundled_schemas
from ..schemas.vocabulary import FUNCTION_PATTERN, RANK_WINDOW, SINGLE_OBJECT_HEADER_LEN
from .checks import constraints_sql
from .identifiers import ident

RAW_TABLES = {FUNCTION_PATTERN: "raw_function_patterns", RANK_WINDOW: "raw_rank_windows"}

_AVRO_TO_CH = {"int": "Int32", "long": "Int64", "float": "Float32", "double": "Float64",
               "string": "String", "boolean": "UInt8"}


@dataclass(frozen=True)
class RawMessage:
    value: bytes  # the whole message (header + body), for dead-lettering
    topic: str
    partition: int
    offset: int


def _ch_type(avro_type: object) -> str:
    if isinstance(avro_type, str):
        return _AVRO_TO_CH[avro_type]
    assert isinstance(avro_type, dict)
    if avro_type.get("logicalType") == "timestamp-millis":
        return "DateTime64(3, 'UTC')"
    if avro_type["type"] == "array":
        return f"Array({_ch_type(avro_type['items'])})"
    if avro_type["type"] == "map":
        return f"Map(String, {_ch_type(avro_type['values'])})"
    return _ch_type(avro_type["type"])


def raw_table_sql(name: str) -> str:
    """A Null table with every field of the latest ``name`` schema (nothing is stored), and the
    content rules as constraints (:mod:`.checks`): a container with an absurd record is refused."""
    fields = bundled_schemas().latest(name).raw["fields"]
    cols = ", ".join([f"`{ident(f['name'])}` {_ch_type(f['type'])}" for f in fields] + constraints_sql(ident(name)))
    return f"CREATE TABLE IF NOT EXISTS {RAW_TABLES[name]} ({cols}) ENGINE = Null"


_SORTED = "SELECT *, arraySort(arrayMap(x -> x / 1e6, step_time_ns)) AS s, length(s) AS n FROM raw_rank_windows"

VIEWS = {
    "mv_function_stats": (
        "function_stats",
        "SELECT job, window_id, window_start_ms AS window_start, window_s, toUInt32(rank) AS rank, host, gpu,"
        " toUInt32(world_size) AS world_size, signature, function, toInt16(kind) AS kind,"
        " toUInt32(steps) AS steps, toUInt64(count) AS count, total_ns, p50_ns, p90_ns, p99_ns, max_ns,"
        " arrayConcat(hist, arrayWithConstant(hist_first, toInt64(0)), hist_counts) AS hist,"
        " arrayConcat(group_ranks, arrayMap(i -> toInt32(group_ranks_first + i * group_ranks_step),"
        " range(toUInt32(group_ranks_count)))) AS group_ranks, bytes"
        " FROM raw_function_patterns"),
    "mv_iterations": (
        "iterations",
        "SELECT job, toUInt32(rank) AS rank, last_step - length(step_time_ns) + i AS step, window_id,"
        " window_start_ms AS window_start, host, ns / 1e6 AS step_time_ms FROM raw_rank_windows"
        " ARRAY JOIN step_time_ns AS ns, arrayEnumerate(step_time_ns) AS i"),
    "mv_rank_windows": (
        "rank_windows",
        "SELECT job, window_id, window_start_ms AS window_start, window_s, toUInt32(rank) AS rank, host,"
        " gpu, toUInt32(world_size) AS world_size, signature, toUInt32(length(functions)) AS functions,"
        " toUInt32(steps) AS steps, last_step,"
        " if(n = 0, 0, if(n % 2 = 1, s[intDiv(n, 2) + 1], (s[intDiv(n, 2)] + s[intDiv(n, 2) + 1]) / 2))"
        " AS step_time_ms_p50, if(n = 0, 0, s[n]) AS step_time_ms_max, last_event_ms AS last_event,"
        " last_function, pending_group, pending_seq, dropped_events, lost_batches, bytes_received,"
        " toUInt8(ended_cleanly) AS ended_cleanly, toUInt32(restarts) AS restarts, mesh_coords"
        f" FROM ({_SORTED})"),
    "mv_gpu_health": (
        "gpu_health",
        "SELECT job, window_id, window_start_ms AS window_start, toUInt32(rank) AS rank, host, gpu,"
        " toUInt32(hw_samples) AS hw_samples, sm_clock_mhz, sm_clock_max_mhz, temp_c_max, power_w_mean,"
        " util_gpu_pct, throttle_reasons, toInt16(pcie_gen_min) AS pcie_gen_min,"
        " toInt16(pcie_width_min) AS pcie_width_min, nvlink_errors, ecc_uncorrected, xid"
        " FROM raw_rank_windows"),
}


def recreate_raw_tables() -> tuple[str, ...]:
    """Drop and create the raw tables again (with their constraints); the views stay attached."""
    return tuple(f"DROP TABLE IF EXISTS {table}" for table in RAW_TABLES.values()) + tuple(
        raw_table_sql(name) for name in RAW_TABLES)


def recreate_view(view: str) -> tuple[str, ...]:
    """Drop and create one materialized view again (its SELECT changed)."""
    target, select = VIEWS[view]
    name = ident(view)
    return (f"DROP TABLE IF EXISTS {name}",
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name} TO {ident(target)} AS {select}")


def migration_statements() -> tuple[str, ...]:
    tables = tuple(raw_table_sql(name) for name in RAW_TABLES)
    views = tuple(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view} TO {target} AS {select}"
                  for view, (target, select) in VIEWS.items())
    return tables + views


@cache
def _container_header(name: str) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(bundled_schemas().latest(name).raw), [])
    return out.getvalue()


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def container(name: str, messages: list[RawMessage]) -> bytes:
    """An Avro object container file of one block holding the messages' datums."""
    header = _container_header(name)
    block = b"".join(m.value[SINGLE_OBJECT_HEADER_LEN:] for m in messages)
    return header + _zigzag(len(messages)) + _zigzag(len(block)) + block + header[-16:]


def raw_fingerprints() -> dict[bytes, str]:
    """Fingerprint of the latest schema of each raw-ingested type -> its name."""
    schemas = bundled_schemas()
    return {schemas.latest(name).fingerprint: name for name in RAW_TABLES}
