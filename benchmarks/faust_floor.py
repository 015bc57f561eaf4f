"""What Faust itself costs per message: ``python -m benchmarks.faust_floor --json``.

The same backlog as ``benchmarks.throughput`` (the workload's EventBatches, encoded by the
collectors' codec, produced lz4-compressed to a real tansu broker, 8 partitions) is read by
a Faust worker built exactly like ``perftracker worker``'s (``streams.app.bare_app``: same
consumer, producer and fetch-wait settings, at-least-once) whose one agent only counts the
messages: no decode, no summarizer, nothing sent. Its rate is the ceiling of the product's
worker on this host, whatever the agents do; ``--agent`` runs the product's worker
(``perftracker worker``, all three agents) on the same backlog right after, so the two are
compared in one run. Rates are timed from the first message to the last (start-up and the
group join left out); ``*_cpu_s`` is the worker process's CPU time over the same span.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perftracker_ml.deploy.workloads.batches import Workload

from .faust_worker import _cpu_s, catch_up
from .throughput import TOPIC, encode_job, produce, rate


def serve(bootstrap: str, expect: int, out: str) -> None:
    """The counting worker (a subprocess): writes {"messages", "seconds", "cpu_s"} to ``out``
    once ``expect`` messages came, then exits."""
    import faust
    from perftracker_ml.deploy.tansu import free_port
    from perftracker_ml.schemas.settings_loader import load_settings
    from perftracker_ml.streams.app import bare_app

    settings = load_settings(env={"PERFTRACKER_STREAMS_APP_ID": f"floor-{time.time_ns()}"})
    app = bare_app(settings, bootstrap, web_port=free_port())
    topic = app.topic(TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                      internal=False)
    seen = [0, 0.0, 0.0]  # messages, wall and CPU time at the first

    @app.agent(topic, name="floor.count")
    async def count(stream):  # noqa: ANN001, ANN202 (Faust's agent signature)
        async for _raw in stream:
            seen[0] += 1
            if seen[0] == 1:
                seen[1], seen[2] = time.perf_counter(), _cpu_s(os.getpid())
            if seen[0] == expect:
                Path(out).write_text(json.dumps({"messages": expect - 1, "seconds": time.perf_counter() - seen[1],
                                                 "cpu_s": _cpu_s(os.getpid()) - seen[2]}))
                await asyncio.sleep(0)
                os._exit(0)

    faust.Worker(app, loglevel="warning", redirect_stdouts=False).execute_from_commandline()


def floor(bootstrap: str, messages: int, timeout_s: float = 600.0) -> dict:
    """Run the counting worker on the backlog; its {"messages", "seconds", "cpu_s"}."""
    tmp = Path(tempfile.mkdtemp(prefix="pt-bench-floor-"))
    out, log = tmp / "floor.json", tmp / "worker.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.faust_floor", "--serve", bootstrap,
                                 "--expect", str(messages), "--out", str(out)], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PERFTRACKER_DATA_DIR": str(tmp)})
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError(f"the counting worker did not see {messages} messages in {timeout_s:.0f}s; see {log}") from None
    if not out.exists():
        raise RuntimeError(f"the counting worker exited with code {proc.returncode}; see {log}")
    return json.loads(out.read_text())


def run(w: Workload, agent: bool) -> dict:
    from perftracker_ml.deploy.tansu import start_broker

    job = encode_job(w, time.time_ns() - int(w.seconds * 1e9))
    per_msg = job.events / job.batches
    broker = start_broker()
    try:
        produce(broker.bootstrap, job)
        f = floor(broker.bootstrap, job.batches)
        out = {"floor_messages_per_s": rate(f["messages"], f["seconds"]),
               "floor_events_per_s": rate(round(f["messages"] * per_msg), f["seconds"]),
               "floor_cpu_messages_per_s": rate(f["messages"], f["cpu_s"]),
               "floor_us_per_message": round(1e6 * f["seconds"] / max(f["messages"], 1), 1)}
        if agent:
            r = catch_up(broker.bootstrap, TOPIC.split(".")[0], job.batches)
            out.update({"worker_events_per_s": rate(round(r["batches"] * per_msg), r["seconds"]),
                        "worker_cpu_events_per_s": rate(round(r["batches"] * per_msg), r["cpu_s"]),
                        "worker_us_per_message": round(1e6 * r["seconds"] / max(r["batches"], 1), 1),
                        "worker_drained_events_per_s": rate(round(r["batches"] * per_msg), r["drained_s"]),
                        "worker_drained_cpu_events_per_s": rate(round(r["batches"] * per_msg), r["drained_cpu_s"]),
                        "worker_downstream_records": r["downstream_records"]})
            out["floor_share_of_worker_time"] = round(out["floor_us_per_message"] / out["worker_us_per_message"], 3)
    finally:
        broker.stop()
    out.update({"ranks": w.ranks, "messages": job.batches, "events_per_message": round(per_msg, 1),
                "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                "date": time.strftime("%Y-%m-%d")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--seconds", type=int, default=12, help="seconds of the job's batches")
    ap.add_argument("--agent", action="store_true", help="also time perftracker's worker on the same backlog")
    ap.add_argument("--serve", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.expect, args.out)
        return 0
    result = run(Workload(ranks=args.ranks, seconds=args.seconds), args.agent)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
