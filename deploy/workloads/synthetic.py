"""A synthetic data-parallel job: realistic EventBatches of N ranks sent to Kafka.

Used by the walking-skeleton test and by `perftracker synth` to try the
pipeline without torch. Each step of each rank: data loader, forward,
backward, one gradient all_reduce (gloo-like: a rank waits inside the call
until the last member arrives), optimizer step. One rank's function can be
made slower; its peers then wait in the all_reduce (the victims), while the
slow rank's own all_reduce gets shorter (the culprit arrives last).
Times are generated, not slept: ``seconds`` of job time are produced at once,
ending now, one batch per rank per simulated second. ``slow_until_s`` ends the
fault part-way (the job goes on healthy, so its incident resolves). ``final`` ends the
job as real collectors do at a clean exit: each rank's last batch carries the steps left
since its previous batch and is marked ``final`` (EventBatch v4).

A GPU job (``gpu``, the default: the header names each rank's GPU) also sends, per step of
each rank, what the collectors time between CUDA events on a CUDA rank: the device time of
forward, backward and the optimizer step, a ``SpanKind.DEVICE`` span named ``cuda:`` + the
host span's name, starting with it. A healthy rank's device time is its host time. A slow
compute function (``slow_function`` forward, backward or optimizer) is a slow GPU there:
the slowdown lands on the device span while the host span stays healthy (the host only
launches the kernels and runs ahead), except that the host's backward grows by the
device's excess in forward and backward (the host waits at the end of backward for the
gradients' all-reduce, as DDP does); the rank reaches the all_reduce, and the next step,
as late as its device. That device-only excess is the evidence the detection needs to name
a slow GPU. A CPU job (``gpu=False``: header ``gpu`` -1) sends no device spans and its slow
function is slow on the host, as before.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ...collectors.cuda_timing import DEVICE_PREFIX
from ...schemas.vocabulary import SpanKind

SPAN_KIND = {f: int(SpanKind[f.upper()]) for f in ("dataloader", "optimizer", "forward", "backward")}
BASE_MS = {"dataloader": 2.0, "forward": 12.0, "backward": 20.0, "optimizer": 3.0}
NAMES = {"dataloader": "torch.utils.data.DataLoader.__next__", "forward": "forward",
         "backward": "backward", "optimizer": "torch.optim.SGD.step"}
COMPUTE = ("forward", "backward", "optimizer")  # the phases a GPU rank also times on its device
DEVICE = int(SpanKind.DEVICE)


@dataclass(frozen=True)
class SyntheticJob:
    job: str
    ranks: int = 8
    seconds: float = 30.0
    slow_rank: int = -1
    slow_function: str = "forward"
    slowdown: float = 1.4
    slow_until_s: float = math.inf  # job time at which the slow rank recovers
    jitter: float = 0.03
    seed: int = 0
    ranks_per_host: int = 8
    final: bool = False  # each rank's last batch is its exit flush (``final``): the job ends cleanly
    gpu: bool = True  # ranks on GPUs: device spans of the compute phases (module docstring)


def _step_durations(cfg: SyntheticJob, rng: random.Random, t_s: float) -> list[tuple[dict[str, float], dict[str, float]]]:
    """Per rank (host times, device times) in ms; device times only for a GPU job's compute
    phases (module docstring: a slow compute function of a GPU job is slow on the device)."""
    steps = []
    for rank in range(cfg.ranks):
        d = {f: BASE_MS[f] * rng.lognormvariate(0, cfg.jitter) for f in BASE_MS}
        dev = {f: d[f] for f in COMPUTE} if cfg.gpu else {}
        if rank == cfg.slow_rank and t_s < cfg.slow_until_s:
            if cfg.gpu and cfg.slow_function in COMPUTE:
                dev[cfg.slow_function] *= cfg.slowdown
                d["backward"] += sum(dev[f] - d[f] for f in ("forward", "backward"))
            else:
                d[cfg.slow_function] *= cfg.slowdown
        steps.append((d, dev))
    return steps


def batches(cfg: SyntheticJob) -> Iterator[tuple[int, dict]]:
    """Yield (rank, EventBatch record) in time order, one batch per rank per simulated second."""
    rng = random.Random(cfg.seed)
    group = {"group_id": f"g:{cfg.ranks}:0", "ranks": list(range(cfg.ranks))}
    names = [NAMES[f] for f in BASE_MS] + ["all_reduce"]
    op = len(names) - 1
    index = {f: i for i, f in enumerate(BASE_MS)}
    device_index = {f: len(names) + i for i, f in enumerate(COMPUTE)} if cfg.gpu else {}
    names += [DEVICE_PREFIX + NAMES[f] for f in device_index]  # cuda:<the host span's name>
    wall0 = time.time_ns() - int(cfg.seconds * 1e9)
    mono0 = [rng.randrange(10**12, 10**13) for _ in range(cfg.ranks)]  # unrelated clocks per rank
    skew = [rng.randint(-50, 50) * 1_000_000 for _ in range(cfg.ranks // cfg.ranks_per_host + 1)]
    t_ns = 0  # job time of the synchronous step start (all ranks leave the all_reduce together)
    step = 0
    pending = [_empty(cfg, r, names, group) for r in range(cfg.ranks)]
    next_flush = 1_000_000_000
    while t_ns < cfg.seconds * 1e9:
        durs = _step_durations(cfg, rng, t_ns / 1e9)
        pre = [d["dataloader"] + d["forward"] + d["backward"] for d, _ in durs]
        arrive_last = max(pre)
        for r, (d, dev) in enumerate(durs):
            cols = pending[r]
            cursor = t_ns
            for f in ("dataloader", "forward", "backward"):
                _span(cols, SPAN_KIND[f], index[f], step, mono0[r] + cursor, d[f])
                if f in dev:
                    _span(cols, DEVICE, device_index[f], step, mono0[r] + cursor, dev[f])
                cursor += int(d[f] * 1e6)
            wait_ms = arrive_last - pre[r] + 1.5  # 1.5 ms transfer once everyone arrived
            c = cols["comms"]
            for k, v in (("op", op), ("group", 0), ("seq", step), ("bytes", 4 << 20),
                         ("step", step), ("start_ns", mono0[r] + cursor), ("dur_ns", int(wait_ms * 1e6))):
                c[k].append(v)
            cursor += int(wait_ms * 1e6)
            _span(cols, SPAN_KIND["optimizer"], index["optimizer"], step, mono0[r] + cursor, d["optimizer"])
            if dev:
                _span(cols, DEVICE, device_index["optimizer"], step, mono0[r] + cursor, dev["optimizer"])
        # the next step starts once every rank's optimizer step ran (on its device, if any)
        step_ms = arrive_last + 1.5 + max(dev.get("optimizer", d["optimizer"]) for d, dev in durs)
        for r in range(cfg.ranks):
            it = pending[r]["iterations"]
            it["step"].append(step)
            it["start_ns"].append(mono0[r] + t_ns)
            it["dur_ns"].append(int(step_ms * 1e6))
        t_ns += int(step_ms * 1e6)
        step += 1
        if t_ns >= next_flush:
            for r in range(cfg.ranks):
                rec = pending[r]
                rec["mono_ns"] = mono0[r] + t_ns
                rec["wall_ns"] = wall0 + t_ns + skew[r // cfg.ranks_per_host]
                yield r, rec
                pending[r] = _empty(cfg, r, names, group, seq=rec["seq"] + 1)
            next_flush += 1_000_000_000
    if cfg.final:  # the exit flush: what is left, marked final
        for r in range(cfg.ranks):
            rec = pending[r]
            rec["mono_ns"] = mono0[r] + t_ns
            rec["wall_ns"] = wall0 + t_ns + skew[r // cfg.ranks_per_host]
            rec["final"] = True
            yield r, rec


def _span(cols: dict, kind: int, name: int, step: int, start_ns: int, dur_ms: float) -> None:
    s = cols["spans"]
    for k, v in (("kind", kind), ("name", name), ("path", -1), ("step", step),
                 ("start_ns", start_ns), ("dur_ns", int(dur_ms * 1e6))):
        s[k].append(v)


def _empty(cfg: SyntheticJob, rank: int, names: list[str], group: dict, seq: int = 0) -> dict:
    return {
        "job": cfg.job, "rank": rank, "local_rank": rank % cfg.ranks_per_host, "world_size": cfg.ranks,
        "host": f"node{rank // cfg.ranks_per_host:03d}", "gpu": rank % cfg.ranks_per_host if cfg.gpu else -1, "gpu_uuid": "",
        "pid": 1000 + rank, "seq": seq, "dropped_events": 0, "wall_ns": 0, "mono_ns": 0,
        "names": list(names), "groups": [group],
        "iterations": {"step": [], "start_ns": [], "dur_ns": []},
        "spans": {k: [] for k in ("kind", "name", "path", "step", "start_ns", "dur_ns")},
        "comms": {k: [] for k in ("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")},
        "kernels": [],
    }


def produce(cfg: SyntheticJob, conf: dict[str, str], topic: str) -> int:
    """Send the job's batches to ``topic`` keyed job|rank; returns the number sent."""
    from confluent_kafka import Producer

    from ...schemas import Codec
    from ...schemas.vocabulary import EVENT_BATCH

    codec = Codec(EVENT_BATCH)
    producer = Producer({**conf, "linger.ms": 20, "compression.type": "lz4"})
    sent = 0
    for rank, record in batches(cfg):
        producer.produce(topic, key=f"{cfg.job}|{rank}".encode(), value=codec.encode(record))
        producer.poll(0)
        sent += 1
    remaining = producer.flush(15)
    if remaining:
        from ...schemas.errors import PerftrackerError
        raise PerftrackerError(f"{remaining} synthetic batches were not delivered to {conf.get('bootstrap.servers')}")
    return sent
