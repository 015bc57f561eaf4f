"""Recorded real runs replayed and scored: ``python -m benchmarks.replay [--json] [--sets evaluation]``.

Every recording of the corpus (:mod:`benchmarks.corpus`: real ``torchrun`` jobs under
``perftracker launch``, each with its truth) goes through the stream topology on its own
recorded clock (:func:`perftracker_ml.streams.replay.replay`) at the default detection policy,
and is scored against its truth. Prints one JSON object::

    {"recordings": N, "seconds": ..., "tuning": {...}, "evaluation": {"culprits_pct", "causes_pct",
     "locations_pct", "false_ranks", "false_alarms", "p50_windows_to_detect", "wrong", ...},
     "details": [one object per recording]}

The evaluation set is frozen: a rule change must leave its figures no worse than the
baseline in docs/detection.md. Deterministic: the same corpus and code give the same JSON
(but ``seconds``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from perftracker_ml.schemas.recording import Recording
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.replay import replay

from .corpus import BASELINE, CORPUS_DIR, SETS, Entry, entries, score_replay, totals, verdict


def replay_entry(entry: Entry, policy: DetectionPolicy) -> dict[str, Any]:
    result = replay(Recording(entry.recording).messages(), policy)
    scored = score_replay(entry.truth, result.anomalies, result.emitted_ms, policy.window_ms)
    return {**scored, "messages": result.messages, "rejected": sum(result.rejected.values())}


def run(root: Path = CORPUS_DIR, sets: tuple[str, ...] = SETS, policy: DetectionPolicy | None = None) -> dict[str, Any]:
    policy = policy or DetectionPolicy()
    started = time.monotonic()
    details = [replay_entry(e, policy) for e in entries(root, sets)]
    out: dict[str, Any] = {"recordings": len(details), "seconds": round(time.monotonic() - started, 1)}
    for s in sets:
        out[s] = totals([d for d in details if d["set"] == s])
    out["details"] = details
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object (the default output is the same)")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated: tuning, evaluation")
    parser.add_argument("--dir", type=Path, default=CORPUS_DIR, help="the corpus (default benchmarks/recordings)")
    parser.add_argument("--write-baseline", action="store_true",
                        help="write each recording's verdicts to <dir>/baseline.json (what tests hold replays to)")
    args = parser.parse_args()
    sets = tuple(s.strip() for s in args.sets.split(",") if s.strip())
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        parser.error(f"unknown sets {unknown}: choose from {', '.join(SETS)}")
    out = run(args.dir, sets)
    if not out["recordings"]:
        print(f"no recording under {args.dir}", file=sys.stderr)
        sys.exit(1)
    if args.write_baseline:
        baseline = {d["name"]: verdict(d) for d in out["details"]}
        (args.dir / BASELINE.name).write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
