"""Hostile input for the tests: hypothesis strategies (property tests) and a deterministic
generator of many distinct hostile messages (the stack test sends >= 10,000 of them).

Hostile means what an attacker or a broken collector sends: random bytes, truncated Avro,
unknown fingerprints, records of the wrong type, and well-formed records with absurd
content (ranks 10⁹ or −5, world size 0, negative or ±2⁶² durations, name indexes past the
table, ragged columns, 100 KB strings, NaN). Names with quotes, markup and control
characters are *odd but valid*: they must be processed, and rendered inert downstream.
"""

from __future__ import annotations

import copy
import io
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import fastavro
from fastavro.schema import parse_schema
from hypothesis import strategies as st
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, MultiCodec, columns
from perftracker_ml.schemas.codec import SINGLE_OBJECT_MAGIC

ODD_NAMES = ["'; DROP TABLE collectives; --", '"quoted" \\ ${x} `tick`', "<script>alert(1)</script>",
             "line\nforged: yes\r\x1b[31m\x00\x07", "*bold* _md_ [x](http://e) <!channel>", "ünï©ødé ✓"]
SINK_NAMES = ["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly"]

# ---- hypothesis strategies ---------------------------------------------------------------------
HOSTILE_INT32 = st.one_of(st.integers(-3, 12), st.sampled_from([-5, -(2**31), 2**31 - 1, 10**9, 10**6]),
                          st.integers(-(2**31), 2**31 - 1))
HOSTILE_INT64 = st.one_of(st.integers(-3, 10**10), st.sampled_from([-(2**62), -(2**63), 2**63 - 1, 2**62]),
                          st.integers(-(2**63), 2**63 - 1))
HOSTILE_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, -1.0, 0.0]))
HOSTILE_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(ODD_NAMES + ["", "j" * 5000]))


def good_batch(job: str = "prop", index: int = 4) -> dict:
    """A realistic EventBatch of rank ``index % 4`` of a 4-rank job."""
    return copy.deepcopy(list(batches(SyntheticJob(job, ranks=4, seconds=2)))[index][1])


GOOD_BATCH = good_batch()
HEADER = {"rank": HOSTILE_INT32, "local_rank": HOSTILE_INT32, "world_size": HOSTILE_INT32, "gpu": HOSTILE_INT32,
          "pid": HOSTILE_INT32, "seq": HOSTILE_INT64, "dropped_events": HOSTILE_INT64, "wall_ns": HOSTILE_INT64,
          "mono_ns": HOSTILE_INT64, "job": HOSTILE_TEXT, "host": HOSTILE_TEXT, "gpu_uuid": HOSTILE_TEXT}
INDEXES = ("kind", "name", "path", "op", "group")
COLUMNS = [(block, col) for block in ("spans", "comms", "iterations") for col in GOOD_BATCH[block]]


def _corrupt(draw: Callable, rec: dict) -> None:
    """One hostile change: a header field, one column value, a ragged column, the names or groups."""
    what = draw(st.sampled_from(["header", "value", "ragged", "names", "groups"]))
    if what == "header":
        field = draw(st.sampled_from(sorted(HEADER)))
        rec[field] = draw(HEADER[field])
    elif what in ("value", "ragged"):
        block, col = draw(st.sampled_from(COLUMNS))
        values = rec[block][col]
        if what == "ragged":
            rec[block][col] = values[:-1] if draw(st.booleans()) else values + values[-1:]
        elif values:
            values[draw(st.integers(0, len(values) - 1))] = draw(HOSTILE_INT32 if col in INDEXES else HOSTILE_INT64)
    elif what == "names":
        rec["names"] = draw(st.lists(HOSTILE_TEXT, max_size=8))
    else:
        rec["groups"] = [{"group_id": draw(HOSTILE_TEXT),
                          "ranks": draw(st.lists(st.one_of(st.integers(-1, 4), HOSTILE_INT32), max_size=5))}]


@st.composite
def hostile_event_batch(draw: Callable) -> dict:
    """A well-typed EventBatch with plausible edge values (-1 paths, in-flight comm markers, zero
    durations) and up to three hostile changes."""
    rec = copy.deepcopy(GOOD_BATCH)
    for block, col in COLUMNS:
        if draw(st.integers(0, 4)) == 2:  # hypothesis favours bounds: test the middle
            low = -1 if (block, col) in (("spans", "path"), ("comms", "dur_ns")) else 0
            top = 4 if col in INDEXES else 4 * 10**9
            rec[block][col] = [draw(st.integers(low, top)) for _ in rec[block][col]]
    for _ in range(draw(st.integers(0, 3))):
        _corrupt(draw, rec)
    return rec


def _field_strategy(avro: object) -> st.SearchStrategy | None:
    kind = avro if isinstance(avro, str) else avro.get("type")  # type: ignore[union-attr]
    items = avro.get("items") if isinstance(avro, dict) else None
    scalar = {"int": HOSTILE_INT32, "long": HOSTILE_INT64, "float": HOSTILE_FLOAT, "double": HOSTILE_FLOAT,
              "string": HOSTILE_TEXT}
    if isinstance(kind, str) and kind in scalar and not (isinstance(avro, dict) and kind == "long"):
        return scalar[kind]
    if kind == "array" and isinstance(items, str) and items in scalar:
        return st.lists(scalar[items], max_size=5)
    return None  # records, enums, maps, timestamps: left as they are


@st.composite
def hostile_sink_record(draw: Callable) -> tuple[str, dict]:
    """A worker output (FunctionPattern, RankWindow, FunctionComparison, Anomaly) with some
    scalar or array fields replaced by hostile values."""
    from perftracker_ml.schemas import bundled_schemas

    name, rec = draw(st.sampled_from([(n, r) for n, r in samples.job_records("prop", world=4, windows=1)
                                      if n in SINK_NAMES]))
    rec = copy.deepcopy(rec)
    for f in bundled_schemas().latest(name).raw["fields"]:
        strategy = _field_strategy(f["type"])
        if strategy is not None and f["name"] != "schema_version" and draw(st.integers(0, 3)) == 2:
            rec[f["name"]] = draw(strategy)
    return name, rec


# ---- a deterministic flood of distinct hostile messages ------------------------------------------
@dataclass(frozen=True)
class Hostile:
    kind: str
    topic: str  # short topic name: events, hardware, patterns, findings, anomalies
    value: bytes


EVENTS = Codec("EventBatch")
HARDWARE = Codec("HardwareBatch")
OUTPUTS = MultiCodec(SINK_NAMES)


class BatchEncoder:
    """Thousands of EventBatches that differ in their header: an Avro record's encoding is its
    fields' encodings in order, so the header fields (job ... mono_ns) are encoded per message
    and the columns once per distinct content (same bytes as ``Codec.encode``, checked)."""

    HEADER_FIELDS = 13  # schema_version .. mono_ns

    def __init__(self) -> None:
        latest = EVENTS.writer
        fields = latest.raw["fields"]
        self._frame = SINGLE_OBJECT_MAGIC + latest.fingerprint
        self._head = parse_schema({"type": "record", "name": "Head", "fields": fields[:self.HEADER_FIELDS]})
        self._tail = parse_schema({"type": "record", "name": "Tail", "namespace": latest.raw["namespace"],
                                   "fields": fields[self.HEADER_FIELDS:]})
        self._tails: dict[object, bytes] = {}

    def encode(self, rec: dict, tail_key: object) -> bytes:
        """``rec`` encoded; records with the same ``tail_key`` must have the same columns."""
        tail = self._tails.get(tail_key)
        if tail is None:
            tail = self._tails[tail_key] = _avro(self._tail, columns.pack(rec))  # v8: packed columns
        return self._frame + _avro(self._head, {"schema_version": EVENTS.version, **rec}) + tail


def _avro(schema: object, rec: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, rec)
    return out.getvalue()


def _absurd_batch(rng: random.Random, base: dict, serial: int) -> tuple[str, dict, object]:
    # unknown jobs, every one distinct; only what is changed is copied
    rec = {**base, "job": f"junk-{serial}", "seq": serial}
    spans, iters, comms = dict(base["spans"]), dict(base["iterations"]), dict(base["comms"])
    rec.update(spans=spans, iterations=iters, comms=comms)
    n_spans = len(spans["kind"])
    choice = rng.randrange(9)
    key: object = "base"  # the columns' identity, for BatchEncoder
    if choice == 0:
        rec["rank"] = rng.choice([10**9, -5, 2**31 - 1, rec["world_size"]])
    elif choice == 1:
        rec["world_size"] = rng.choice([0, -1, 2**31 - 1])
    elif choice == 2:
        at, value = rng.randrange(n_spans), rng.choice([-1, -(2**62), 2**63 - 1, 7200 * 10**9])
        spans["dur_ns"], key = _replaced(spans["dur_ns"], at, value), (choice, at, value)
    elif choice == 3:
        value = rng.choice([-(2**62), -5, 2**62])
        iters["dur_ns"], key = _replaced(iters["dur_ns"], 0, value), (choice, value)
    elif choice == 4:
        at, value = rng.randrange(n_spans), rng.choice([10**6, -7, len(rec["names"])])
        spans["name"], key = _replaced(spans["name"], at, value), (choice, at, value)
    elif choice == 5:
        comms["seq"], key = comms["seq"] + [1], choice  # ragged columns
    elif choice == 6:  # one in ten 100 KB, the others just past the id bound
        rec[rng.choice(["job", "host"])] = "x" * (100_000 if serial % 10 == 0 else 300) + str(serial)
    elif choice == 7:
        rec["names"], key = ["n" * 5000] + rec["names"][1:], choice
    else:
        comms["group"], key = _replaced(comms["group"], 0, 3), choice  # past the groups table
    return f"absurd:{choice}", rec, key


def _replaced(values: list, at: int, value: int) -> list:
    out = list(values)
    out[at] = value
    return out


def _huge(rng: random.Random, base: dict, serial: int) -> bytes:
    """25k spans, one column short: large to decode, then rejected as ragged (~0.9 MB as
    EventBatch v8, whose columns take 36 bytes a span: a producer refuses a message over 1 MB)."""
    rec = copy.deepcopy(base)
    rec["job"] = f"huge-{serial}"
    n = 25_000
    rec["spans"] = {"kind": [1] * n, "name": [0] * n, "path": [-1] * n, "step": [0] * n,
                    "start_ns": list(range(n)), "dur_ns": [1000] * (n - 1)}
    return EVENTS.encode(rec)


def _nan_hardware(serial: int) -> bytes:
    n = 3
    ints = {k: [1, 1, 1] for k in (
        "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "util_gpu_pct", "util_mem_pct", "temp_c",
        "throttle_reasons", "pcie_gen", "pcie_width", "pcie_tx_kbps", "pcie_rx_kbps", "nvlink_tx_kbps",
        "nvlink_rx_kbps", "nvlink_errors", "ecc_uncorrected", "xid")}
    return HARDWARE.encode({
        "job": f"hw-{serial}", "rank": 0, "host": "h", "gpu": 0, "gpu_uuid": "", "seq": serial,
        "wall_ns": [1_700_000_000_000_000_000] * n, **ints,
        "power_w": [300.0, math.nan, -math.inf], "power_limit_w": [700.0] * n})


OUTPUT_RECORDS = [(n, r) for n, r in samples.job_records("out", world=4, windows=1) if n in SINK_NAMES]


def _absurd_output(rng: random.Random, serial: int) -> tuple[str, str, bytes]:
    name, rec = rng.choice(OUTPUT_RECORDS)
    rec = {**rec, "job": f"out-{serial}"}
    field, value = {"FunctionPattern": ("rank", -5), "RankWindow": ("world_size", -1),
                    "FunctionComparison": ("members", [0, -5]), "Anomaly": ("score", math.nan)}[name]
    rec[field] = value
    topic = {"FunctionPattern": "patterns", "RankWindow": "findings", "FunctionComparison": "findings",
             "Anomaly": "anomalies"}[name]
    return f"absurd-output:{name}", topic, OUTPUTS.encode(name, rec)


def hostile_messages(count: int, seed: int = 13, downstream: int = 200, huge: int = 5) -> Iterator[Hostile]:
    """``count`` distinct hostile messages: mostly for the workers' input topics, ``downstream``
    of them worker outputs with absurd content (for the worker's later stages and the sink)."""
    rng = random.Random(seed)
    base = good_batch("junk")
    for block in ("spans", "comms", "iterations"):  # a short batch: cheap to send
        base[block] = {col: values[:12] for col, values in base[block].items()}
    fast = BatchEncoder()
    assert fast.encode(base, "base") == EVENTS.encode(base)
    seen: set[bytes] = set()
    serial = 0
    while len(seen) < count:
        serial += 1
        topic = "events"
        roll = rng.random()
        valid = fast.encode({**base, "job": f"junk-{serial}", "seq": serial}, "base") if 0.15 <= roll < 0.40 else b""
        if len(seen) < downstream:
            kind, topic, value = _absurd_output(rng, serial)
        elif len(seen) < downstream + huge:
            kind, value = "huge-array", _huge(rng, base, serial)
        elif roll < 0.15:
            kind, value = "random-bytes", rng.randbytes(rng.randrange(1, 400))
        elif roll < 0.30:
            kind, value = "truncated", valid[:rng.randrange(11, len(valid) - 1)]
        elif roll < 0.40:
            kind, value = "unknown-fingerprint", valid[:2] + rng.randbytes(8) + valid[10:]
        elif roll < 0.45:
            kind, value = "wrong-record-type", OUTPUTS.encode("Anomaly", samples.anomaly(f"junk-{serial}"))
        elif roll < 0.50:
            kind, topic, value = "nan-hardware", "hardware", _nan_hardware(serial)
        else:
            kind, rec, key = _absurd_batch(rng, base, serial)
            value = fast.encode(rec, key)
        if value not in seen:
            seen.add(value)
            yield Hostile(kind, topic, value)


def odd_but_valid_batches(job: str, count: int) -> Iterator[bytes]:
    """EventBatches of a 4-rank job whose function names hold quotes, markup, control characters."""
    for i, (_, rec) in enumerate(batches(SyntheticJob(job, ranks=4, seconds=max(1, count // 4)))):
        if i >= count:
            return
        rec["names"] = [ODD_NAMES[(i + k) % len(ODD_NAMES)] + f" {k}" for k in range(len(rec["names"]))]
        yield EVENTS.encode(rec)
