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
(but ``seconds``). ``--reencode v8`` replays every recording with its EventBatches
re-encoded as v8 (packed columns) first, and as recorded (v5..v7, list columns): each
detail's ``same_as_recorded`` (every finding byte for byte, its time, what was set aside) and
the totals ``same_as_recorded`` / ``different_from_recorded`` say whether the two paths agree.
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
from perftracker_ml.streams.replay import reencoded, replay

from .corpus import BASELINE, CORPUS_DIR, SETS, Entry, entries, score_replay, totals, verdict


def replay_entry(entry: Entry, policy: DetectionPolicy, reencode: int | None = None) -> dict[str, Any]:
    """One recording replayed and scored; with ``reencode``, its EventBatches re-encoded as that
    version first, and replayed as recorded too: ``same_as_recorded`` says whether the findings
    (every Anomaly, byte for byte) and what was set aside are the recorded bytes' own."""
    messages = list(Recording(entry.recording).messages())
    result = replay(messages if reencode is None else reencoded(messages, reencode), policy)
    scored = score_replay(entry.truth, result.anomalies, result.emitted_ms, policy.window_ms)
    out = {**scored, "messages": result.messages, "rejected": sum(result.rejected.values())}
    if reencode is not None:
        recorded = replay(messages, policy)
        out["same_as_recorded"] = (result.canonical() == recorded.canonical() and result.emitted_ms == recorded.emitted_ms
                                   and result.rejected == recorded.rejected and result.records == recorded.records)
    return out


def run(root: Path = CORPUS_DIR, sets: tuple[str, ...] = SETS, policy: DetectionPolicy | None = None,
        reencode: int | None = None) -> dict[str, Any]:
    """Replay and score every recording; ``reencode``: each EventBatch re-encoded as that
    EventBatch version first (:func:`~perftracker_ml.streams.replay.reencoded`), each recording
    also replayed as recorded and compared."""
    policy = policy or DetectionPolicy()
    started = time.monotonic()
    details = [replay_entry(e, policy, reencode) for e in entries(root, sets)]
    out: dict[str, Any] = {"recordings": len(details), "seconds": round(time.monotonic() - started, 1)}
    if reencode is not None:
        out["reencoded_as"] = f"EventBatch v{reencode}"
        out["same_as_recorded"] = sum(d["same_as_recorded"] for d in details)
        out["different_from_recorded"] = [d["name"] for d in details if not d["same_as_recorded"]]
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
    parser.add_argument("--reencode", metavar="vN", default=None,
                        help="re-encode every recorded EventBatch as version N first (v8: the columnar path) and "
                             "compare with the replay of the recorded bytes (twice the time)")
    args = parser.parse_args()
    reencode = int(args.reencode.lstrip("v")) if args.reencode else None
    sets = tuple(s.strip() for s in args.sets.split(",") if s.strip())
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        parser.error(f"unknown sets {unknown}: choose from {', '.join(SETS)}")
    out = run(args.dir, sets, reencode=reencode)
    if not out["recordings"]:
        print(f"no recording under {args.dir}", file=sys.stderr)
        sys.exit(1)
    if args.write_baseline:
        baseline = {d["name"]: verdict(d) for d in out["details"]}
        (args.dir / BASELINE.name).write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
