"""Where the collectors' cost on the training thread comes from, part by part and phase by phase.

``python -m benchmarks.collector_ablation --json`` runs a one-rank gloo DDP
training loop (the MLP of ``collector_overhead``: DataLoader, forward, backward,
SGD step) in many short interleaved rounds: without collectors, then attached
with parts switched off, then fully attached (no broker: events are counted,
not sent). Each step's phases are timed on the training thread's own CPU clock:
``fetch`` (``DataLoader.__next__``), ``forward`` (``zero_grad``, forward and
loss), ``backward`` (DDP's bucket all-reduce included) and ``optimizer``. It
prints, for each configuration, the median over rounds of the difference to the
run without collectors *in the same round*, in microseconds per step::

    {"off_us_per_step": ..., "off_phases_us": {...}, "configs":
     {"full": {"added_us": ..., "added_pct": ..., "phases_added_us": {...}}, ...}}

Why paired rounds: on a shared machine the same configuration drifts by several
percent over a minute; neighbouring rounds drift alike, so their differences
resolve a few microseconds per step where medians of whole runs do not. The
order of the configurations rotates from round to round. The
costs are *in situ*: a hook that takes 1 us in a tight loop costs 3-5 us inside
a training step, whose torch code evicts it from the caches between calls.
Noise: ``off_spread_pct`` is the rounds' interquartile range without collectors.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "python_only": dict(comms=False, ddp_hook=False, forward=False, gc=False),
    "no_forward": dict(forward=False),
    "no_ddp_hook": dict(ddp_hook=False),
    "full": {},
}
QUIET = dict(control=False, nvml_interval_s=0.0, profile_every_s=0.0)
PHASES = ("fetch", "forward", "backward", "optimizer")


def _loop(torch: Any, data: Any, steps: int) -> dict[str, float]:
    """Microseconds of training-thread CPU per step, by phase."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(data, batch_size=32))
    clock = time.thread_time_ns
    fetch = forward = backward = optimizer = 0
    for _ in range(steps):
        t0 = clock()
        x, y = next(batches)
        t1 = clock()
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        t2 = clock()
        loss.backward()
        t3 = clock()
        opt.step()
        t4 = clock()
        fetch += t1 - t0
        forward += t2 - t1
        backward += t3 - t2
        optimizer += t4 - t3
    return {name: ns / steps / 1000 for name, ns in zip(PHASES, (fetch, forward, backward, optimizer),
                                                         strict=True)}


def measure(rounds: int, steps: int) -> dict:
    import logging

    import torch
    import torch.distributed as dist
    from perftracker_ml.collectors import api
    from perftracker_ml.deploy.tansu import free_port
    from torch.utils.data import TensorDataset

    logging.getLogger("perftracker_ml.collectors").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    data = TensorDataset(torch.randn(steps * 32, 64), torch.randn(steps * 32, 8))
    per_config: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    try:
        _loop(torch, data, steps)  # warm-up
        names = list(CONFIGS)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # no position bias
                overrides = CONFIGS[name]
                gc.collect()  # the previous block's models and hooks go before timing starts
                if overrides is not None:
                    api.attach("ablation", env={}, bootstrap_servers="", **QUIET, **overrides)
                try:
                    per_config[name].append(_loop(torch, data, steps))
                finally:
                    api.detach()
    finally:
        dist.destroy_process_group()
    return summarize(per_config)


def summarize(per_config: dict[str, list[dict[str, float]]]) -> dict:
    """Medians of same-round differences to ``off``, in total and by phase."""
    off_rounds = per_config["off"]
    off_totals = [sum(r.values()) for r in off_rounds]
    off = statistics.median(off_totals)
    q = statistics.quantiles(off_totals, n=4) if len(off_totals) >= 2 else [off, off, off]
    phases = list(off_rounds[0])
    configs = {}
    for name, rounds in per_config.items():
        if name == "off":
            continue
        added = statistics.median(sum(r.values()) - o for r, o in zip(rounds, off_totals, strict=True))
        by_phase = {p: round(statistics.median(r[p] - o[p] for r, o in zip(rounds, off_rounds, strict=True)), 1)
                    for p in phases}
        configs[name] = {"added_us": round(added, 1), "added_pct": round(100 * added / off, 2),
                         "phases_added_us": by_phase}
    return {"off_us_per_step": round(off, 1),
            "off_phases_us": {p: round(statistics.median(r[p] for r in off_rounds), 1) for p in phases},
            "off_spread_pct": round(100 * (q[2] - q[0]) / off, 2), "rounds": len(off_rounds),
            "configs": configs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100, help="training steps per round and configuration")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
