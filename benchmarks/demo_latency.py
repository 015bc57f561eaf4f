"""Each demo fault end to end: is the culprit right, and how fast is it named?

``python -m benchmarks.demo_latency --json`` runs `perftracker demo` once per fault
(real torchrun, 4 gloo ranks, tansu, a Faust worker, chDB) on one embedded stack
in a temporary data dir, and prints one JSON object per fault::

    {"fault": ..., "culprit_correct": true|false, "cause": ..., "seconds_to_detect": ...,
     "false_alarms": ..., "seconds_total": ...}

culprit_correct: rank 2 and the expected cause named, no other rank blamed (for
``none``: nothing reported). seconds_to_detect: from the faulty rank's injection
to the first poll that finds the anomaly in the store. false_alarms: root causes
naming anything but the injected fault. Goals: all correct, <= 15 s to detect, the
default demo (slow-dataloader) <= 120 s in all.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from perftracker_ml.deploy.demo.runner import FAULTS, run_demo
from perftracker_ml.deploy.stack import down
from perftracker_ml.schemas.settings_loader import load_settings


def measure(fault: str, data_dir: Path, steps: int, relay: bool = False) -> dict:
    settings = load_settings(env={"PERFTRACKER_DATA_DIR": str(data_dir)})
    result = run_demo(settings, fault=fault, ranks=4, steps=steps, echo=lambda _line: None, relay=relay)
    right = result.naming_fault(result.rows)
    return {"fault": fault, "culprit_correct": result.culprit_correct,
            "cause": right[0]["cause"] if right else (result.rows[0]["cause"] if result.rows else None),
            "seconds_to_detect": result.seconds_to_detect,
            "false_alarms": len(result.rows) - len(right), "seconds_total": result.seconds_total, "relay": relay}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per fault (default)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--relay", action="store_true", help="the ranks send through a relay on the host "
                        "(`perftracker launch --relay`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pt-demo-bench-") as tmp:
        data_dir = Path(tmp)
        try:
            for fault in args.faults.split(","):
                print(json.dumps(measure(fault.strip(), data_dir, args.steps, args.relay)), flush=True)
        finally:
            down(load_settings(env={"PERFTRACKER_DATA_DIR": str(data_dir)}))


if __name__ == "__main__":
    main()
