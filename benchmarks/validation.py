"""Cost of content validation next to decoding: ``python -m benchmarks.validation [--json]``.

For each record the worker or the sink validates: the decode the record goes through
anyway (the worker's ``MultiCodec``, the sink's fast ``RecordDecoder``) and
:func:`perftracker_ml.schemas.validate.validate` on the decoded record, in CPU microseconds
(best of 7 rounds of ``process_time``, so a busy machine inflates them less), per record
and per event for EventBatches: one rank's batch of one second of a synthetic 8-rank job
(~150 events) and one of 20 seconds (~3,000 events, a collector with a long flush interval), each written as EventBatch v7
(list columns) and v8 (packed columns): bytes on the wire (and lz4-compressed, as the collectors'
producer sends them), encode, decode and validate per event. ``--agent`` adds the summarize
agent's decode+validate and chunk fold per event over the throughput workload, v7 and v8.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, MultiCodec, bundled_schemas
from perftracker_ml.schemas.validate import validate
from perftracker_ml.sinks.decode import RecordDecoder

SINK_NAMES = ["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly"]


def cpu_us(fn: Callable[..., object], args: tuple, calls: int, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.process_time() - t) / calls)
    return best * 1e6


def event_batches() -> dict[str, dict]:
    recs = [r for _, r in batches(SyntheticJob("bench", ranks=8, seconds=21, seed=1))]
    one = recs[80]
    long = dict(one)
    for block in ("spans", "comms", "iterations"):  # rank 0's 20 one-second batches as one
        long[block] = {col: sum((r[block][col] for r in recs[0:160:8]), []) for col in one[block]}
    return {"EventBatch 1 s": one, "EventBatch 20 s": long}


def _lz4_size(data: bytes) -> int | None:
    """The batch lz4-compressed (the collectors' producer ``compression.type``); None without lz4."""
    try:
        import lz4.frame
    except ImportError:
        return None
    return len(lz4.frame.compress(data))


def run() -> list[dict]:
    worker = MultiCodec(["EventBatch", "HardwareBatch"])
    writers = {7: Codec("EventBatch", bundled_schemas().restricted("EventBatch", 7)),  # list columns
               8: Codec("EventBatch")}  # packed columns (schemas/columns.py)
    out = []
    for label, rec in event_batches().items():
        for version, writer in writers.items():
            data = writer.encode(rec)
            name, decoded = worker.decode(data)
            assert validate(name, decoded) is None
            events = sum(len(decoded[b][c]) for b, c in (("spans", "kind"), ("comms", "op"), ("iterations", "step")))
            calls = max(20, 20_000 // events)
            dec, val = cpu_us(worker.decode, (data,), calls), cpu_us(validate, (name, decoded), calls)
            enc = cpu_us(writer.encode, (rec,), calls)
            out.append({"record": f"{label} v{version}", "schema_version": version, "events": events,
                        "bytes": len(data), "lz4_bytes": _lz4_size(data),
                        "encode_us": round(enc, 1), "decode_us": round(dec, 1), "validate_us": round(val, 1),
                        "encode_ns_per_event": round(enc * 1e3 / events),
                        "decode_ns_per_event": round(dec * 1e3 / events),
                        "validate_ns_per_event": round(val * 1e3 / events),
                        "decode_validate_us_per_event": round((dec + val) / events, 3),
                        "ratio": round(val / dec, 3)})
    sink, codec = RecordDecoder(SINK_NAMES), MultiCodec(SINK_NAMES)
    seen = set()
    for name, rec in samples.job_records("bench", world=8, windows=1):
        if name in seen or name not in SINK_NAMES:
            continue
        seen.add(name)
        data = codec.encode(name, rec)
        _, decoded = sink.decode(data)
        assert validate(name, decoded) is None
        dec, val = cpu_us(sink.decode, (data,), 3000), cpu_us(validate, (name, decoded), 3000)
        out.append({"record": name, "bytes": len(data), "decode_us": round(dec, 1), "validate_us": round(val, 1),
                    "ratio": round(val / dec, 3)})
    return out


def agent_rows(ranks: int = 256, seconds: int = 8, rounds: int = 3) -> list[dict]:
    """The summarize agent's own calls without a broker (``benchmarks.throughput``'s
    ``decode_all``: the input codec's decode and the validation; ``summarize_all``: the chunk
    fold, window close and polls) over the throughput workload's batches (one per rank and
    second, ~85 events) written as EventBatch v7 and v8: CPU µs per event, best of ``rounds``."""
    from perftracker_ml.collectors.batch import event_count
    from perftracker_ml.deploy.workloads.batches import Workload
    from perftracker_ml.deploy.workloads.batches import batches as workload_batches

    from .throughput import Job, decode_all, summarize_all

    w = Workload(ranks=ranks, seconds=seconds)
    recs = list(workload_batches(w, 1_700_000_000_000 * 1_000_000))
    events = sum(event_count(r) for _, r in recs)
    out = []
    for version in (7, 8):
        codec = Codec("EventBatch", bundled_schemas().restricted("EventBatch", version))
        values = [codec.encode(r) for _, r in recs]
        job = Job([f"{w.job}|{rank}".encode() for rank, _ in recs], values, events, w.ranks)
        dec = summ = float("inf")
        for _ in range(rounds):
            t = time.process_time()
            decoded = decode_all(job)
            dec = min(dec, time.process_time() - t)
            t = time.process_time()
            summarize_all(decoded)
            summ = min(summ, time.process_time() - t)
        out.append({"record": f"agent {ranks} ranks x {seconds} s v{version}", "schema_version": version,
                    "events": events, "batches": len(values), "bytes_per_batch": round(sum(map(len, values)) / len(values)),
                    "decode_validate_us_per_event": round(dec * 1e6 / events, 3),
                    "summarize_us_per_event": round(summ * 1e6 / events, 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--agent", action="store_true",
                        help="also the summarize agent's decode+validate and fold per event, v7 vs v8 (~1 min)")
    args = parser.parse_args(argv)
    rows = run() + (agent_rows() if args.agent else [])
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
