"""Where the collectors' cost on the training thread comes from, part by part, in one process.

``python -m benchmarks.collector_ablation --json`` runs a one-rank gloo DDP
training loop (the MLP of ``collector_overhead``: DataLoader, forward, backward,
SGD step) in interleaved rounds: without collectors, then attached with parts
switched off, then fully attached (no broker: events are counted, not sent). It
prints the training thread's CPU time per step of each configuration (median of
the rounds) and its difference to the run without collectors::

    {"off_us_per_step": ..., "configs": {"full": {"us_per_step": ..., "added_us": ..., "added_pct": ...}, ...}}

Separate processes of ``collector_overhead`` differ by several percent from run
to run on a shared machine; rounds inside one process on the thread's own CPU
clock resolve a few microseconds per step. Noise: compare ``off_spread_pct``
(the rounds' interquartile range without collectors) with the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "python_only": dict(comms=False, ddp_hook=False, forward=False, gc=False),
    "no_ddp_hook": dict(ddp_hook=False),
    "no_gc": dict(gc=False),
    "full": {},
}
QUIET = dict(control=False, nvml_interval_s=0.0, profile_every_s=0.0)


def _loop(torch: Any, data: Any, steps: int) -> float:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=32)
    start = time.thread_time_ns()
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return (time.thread_time_ns() - start) / steps / 1000


def measure(rounds: int, steps: int) -> dict:
    import logging

    import torch
    import torch.distributed as dist
    from perftracker.collectors import api
    from perftracker.deploy.tansu import free_port
    from torch.utils.data import TensorDataset

    logging.getLogger("perftracker.collectors").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    data = TensorDataset(torch.randn(steps * 32, 64), torch.randn(steps * 32, 8))
    per_config: dict[str, list[float]] = {name: [] for name in CONFIGS}
    try:
        _loop(torch, data, steps)  # warm-up
        for _ in range(rounds):
            for name, overrides in CONFIGS.items():
                if overrides is not None:
                    api.attach("ablation", env={}, bootstrap_servers="", **QUIET, **overrides)
                try:
                    per_config[name].append(_loop(torch, data, steps))
                finally:
                    api.detach()
    finally:
        dist.destroy_process_group()
    return summarize(per_config)


def summarize(per_config: dict[str, list[float]]) -> dict:
    off = statistics.median(per_config["off"])
    q = statistics.quantiles(per_config["off"], n=4) if len(per_config["off"]) >= 2 else [off, off, off]
    configs = {}
    for name, values in per_config.items():
        if name == "off":
            continue
        med = statistics.median(values)
        configs[name] = {"us_per_step": round(med, 1), "added_us": round(med - off, 1),
                         "added_pct": round(100 * (med / off - 1), 2)}
    return {"off_us_per_step": round(off, 1), "off_spread_pct": round(100 * (q[2] - q[0]) / off, 2),
            "rounds": len(per_config["off"]), "configs": configs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300, help="training steps per round and configuration")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
