"""Overhead of the collectors on a real 4-rank gloo DDP training (small MLP, CPU).

``python -m benchmarks.collector_overhead --json`` runs the unmodified script
``tests/e2e/scripts/train_ddp.py`` under torchrun, alternately without and with
``perftracker launch`` (interleaved pairs, so machine load affects both alike),
against a local tansu broker, and prints::

    {"step_time_ratio": ..., "events_per_step": ..., "bytes_per_rank_per_s": ..., "rss_added_mb": ...}

* step_time_ratio: median step time with collectors / without (rank 0, warm-up excluded);
* events_per_step: events recorded per rank per step (sent + dropped);
* bytes_per_rank_per_s: Avro bytes delivered per rank / training seconds;
* rss_added_mb: peak RSS of rank 0 with collectors minus without.

Goals: ratio <= 1.005, rss_added_mb <= 50, bytes_per_rank_per_s <= 20000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "e2e" / "scripts" / "train_ddp.py"
NPROC = 4


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={NPROC}", str(SCRIPT)]


def _run(with_collectors: bool, workdir: Path, idx: int, env: dict[str, str]) -> dict:
    report = workdir / f"report-{idx}-{int(with_collectors)}.json"
    stats = workdir / f"stats-{idx}-{{rank}}.json"
    run_env = {**os.environ, **env, "TRAIN_REPORT": str(report),
               "PERFTRACKER_COLLECTOR_STATS_FILE": str(stats)}
    prefix = [sys.executable, "-c", "import sys; from perftracker.collectors.launch import run; "
              "from perftracker.deploy.config import load_settings; "
              f"sys.exit(run(sys.argv[1:], 'bench-{idx}', load_settings()))"]
    cmd = (prefix if with_collectors else []) + _torchrun()
    subprocess.run(cmd, env=run_env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(report.read_text())
    if with_collectors:
        ranks = [json.loads(Path(str(stats).format(rank=r)).read_text()) for r in range(NPROC)]
        result["events"] = statistics.mean(s["events_sent"] + s["events_dropped"] for s in ranks)
        result["bytes"] = statistics.mean(s["bytes_sent"] for s in ranks)
        result["dropped"] = sum(s["events_dropped"] for s in ranks)
    return result


def measure(pairs: int, steps: int) -> dict:
    from perftracker.deploy.admin import ensure_topics
    from perftracker.deploy.tansu import start_broker
    from perftracker.deploy.topics import all_topics

    broker = start_broker()
    try:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, all_topics("bench"))
        env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
               "PERFTRACKER_KAFKA_TOPIC_PREFIX": "bench", "TRAIN_STEPS": str(steps)}
        with tempfile.TemporaryDirectory() as tmp:
            plain, instrumented = [], []
            for i in range(pairs):
                order = (False, True) if i % 2 == 0 else (True, False)
                for flag in order:
                    (instrumented if flag else plain).append(_run(flag, Path(tmp), i, env))
    finally:
        broker.stop()
    return _summarize(plain, instrumented, steps)


def _summarize(plain: list[dict], instrumented: list[dict], steps: int) -> dict:
    base = statistics.median(r["step_ms"] for r in plain)
    with_ms = statistics.median(r["step_ms"] for r in instrumented)
    return {
        "step_time_ratio": round(with_ms / base, 4),
        "events_per_step": round(statistics.mean(r["events"] / steps for r in instrumented), 2),
        "bytes_per_rank_per_s": round(statistics.mean(r["bytes"] / r["train_s"] for r in instrumented)),
        "rss_added_mb": round(statistics.median(r["max_rss_mb"] for r in instrumented)
                              - statistics.median(r["max_rss_mb"] for r in plain), 1),
        "step_ms_without": round(base, 3), "step_ms_with": round(with_ms, 3),
        "per_pair_ratio": [round(a["step_ms"] / b["step_ms"], 4) for a, b in zip(instrumented, plain, strict=True)],
        "events_dropped": sum(r["dropped"] for r in instrumented),
        "pairs": len(plain), "steps": steps, "ranks": NPROC,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved runs without/with collectors")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    args = parser.parse_args()
    result = measure(args.pairs, args.steps)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
