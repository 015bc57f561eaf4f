"""Safety: training is unaffected by a missing broker or by a failing hook."""

from __future__ import annotations

import json
import time
from collections import deque

import pytest
from perftracker_ml.deploy.tansu import free_port

from .helpers import consume_events, first_record, launch, torchrun

pytestmark = pytest.mark.e2e


def test_training_finishes_with_broker_down_and_drops_are_counted(tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens here
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": dead, "TRAIN_STEPS": "30",
           "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "PERFTRACKER_COLLECTOR_STATS_FILE": str(tmp_path / "stats-{rank}.json"),
           "TRAIN_REPORT": str(tmp_path / "report.json")}
    code, seconds = launch(torchrun("train_ddp.py"), "job-down", env)
    assert code == 0
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == 30
    for rank in range(4):
        stats = json.loads((tmp_path / f"stats-{rank}.json").read_text())
        assert stats["events_sent"] == 0
        assert stats["events_buffered"] == 0
        # every iteration, span and collective recorded was lost, and said so
        assert stats["events_dropped"] >= 30 * 6
        assert stats["step"] == 29


def _train_one_process(steps: int, tmp_path) -> float:
    """A small single-process gloo DDP loop (DataLoader, forward, backward, step, save, GC)."""
    import gc
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1)),
                            batch_size=4)
        loss = torch.zeros(())
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            gc.collect()
        dist.all_reduce(torch.ones(4))
        torch.save(model.state_dict(), tmp_path / "ckpt.pt")
        return float(loss.detach())
    finally:
        dist.destroy_process_group()


@pytest.fixture
def attached(tmp_path, monkeypatch):
    import torch  # noqa: F401 - hooks go in when torch is imported
    from perftracker_ml.collectors import api

    monkeypatch.setenv("PERFTRACKER_DATA_DIR", str(tmp_path / "no-stack"))
    monkeypatch.setenv("PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS", "")
    monkeypatch.setenv("PERFTRACKER_COLLECTOR_PROFILE_EVERY_S", "0")
    monkeypatch.setenv("PERFTRACKER_COLLECTOR_GC_MIN_US", "0")
    collector = api.attach("job-inproc", iteration_repeats=3, flush_interval_s=3600.0)
    assert collector is not None and collector.torch_hooks
    yield collector
    api.detach()


def test_exception_planted_in_every_hook_never_reaches_training(attached, tmp_path):
    def boom(*_args, **_kwargs):
        raise RuntimeError("planted")

    attached.recorder.span = boom
    attached.recorder.comm = boom
    attached.recorder._mark = boom
    loss = _train_one_process(steps=8, tmp_path=tmp_path)
    assert loss == loss  # training ran to the end
    assert attached.stats().errors_caught >= 8 * 4


class _ExplodingBuffer(deque):
    def append(self, _event):
        raise RuntimeError("planted in the buffer")


def test_exception_in_the_buffer_never_reaches_training(attached, tmp_path):
    """A buffer whose append fails reaches every recording path, the synchronous
    collective's inline append included (planting on Recorder methods misses it):
    every recorded kind of event was attempted and counted as an error, none reached
    the loop."""
    rec = attached.recorder
    real, rec.events = rec.events, _ExplodingBuffer()
    real.clear()  # events recorded before the swap (e.g. GC pauses since attach) are not this run's
    try:
        loss = _train_one_process(steps=8, tmp_path=tmp_path)
    finally:
        rec.events = real
    assert loss == loss
    # per step: fetch, optimizer, forward, backward, DDP bucket (+ GC), then the explicit all_reduce
    assert attached.stats().errors_caught >= 8 * 5 + 1
    assert len(real) == 0


def test_in_process_hooks_see_the_loop(attached, tmp_path):
    _train_one_process(steps=8, tmp_path=tmp_path)
    events = list(attached.recorder.events)
    kinds = {ev[1] for ev in events if ev[0] == 0}
    assert {1, 2, 3, 4, 5, 6} <= kinds  # dataloader, optimizer, forward, backward, gc, checkpoint
    ops = [ev[1] for ev in events if ev[0] == 1]
    assert ops.count("all_reduce") == 8 + 1  # DDP's bucket all_reduce per step + the explicit one
    iterations = [ev[1] for ev in events if ev[0] == 2]
    assert iterations == list(range(8))
    assert attached.stats().errors_caught == 0


def _past(step: int):
    return lambda record: max(record["iterations"]["step"], default=-1) > step


def test_broker_lost_mid_run_training_goes_on_and_the_collector_reconnects(tmp_path):
    """The broker dies while 4 ranks train and comes back (empty: tansu keeps topics in
    memory) on the same port: training never stops, every rank's collector reconnects
    by itself and delivers its later batches, and the drop count in the last header is
    the one the collector reports.

    Not asserted: that the batches queued during the outage arrive. The restarted
    tansu acknowledges produce requests that reach it before its topics are created
    again, and keeps nothing of them (seen here: 7 batches per rank acknowledged and
    absent); a Kafka broker keeps its topics across a restart.
    """
    import threading

    from perftracker_ml.deploy.tansu import start_broker
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix, job = "rc", "job-reconnect"
    broker = start_broker(log_path=tmp_path / "tansu.log")
    bootstrap, port = broker.bootstrap, broker.port
    conf = {"bootstrap.servers": bootstrap}
    ensure_topics(conf, all_topics(prefix))
    topic = TopicNames.for_prefix(prefix).events
    hold = tmp_path / "hold"
    hold.touch()
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
           "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix, "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "PERFTRACKER_COLLECTOR_STATS_FILE": str(tmp_path / "stats-{rank}.json"),
           "TRAIN_STEPS": "50", "TRAIN_HOLD_FILE": str(hold), "TRAIN_REPORT": str(tmp_path / "report.json")}
    seen: dict = {"broker": broker}

    def outage() -> None:  # beside the job: launch() needs the main thread for its signals
        try:
            before = first_record(bootstrap, topic, job, _past(20), 90, "probe-before")
            seen["before"] = before
            if before is None:
                return
            seen["broker"].stop()
            time.sleep(3.0)  # ranks keep training; their batches queue in librdkafka or are dropped
            seen["broker"] = start_broker(port=port, log_path=tmp_path / "tansu-2.log")
            ensure_topics(conf, all_topics(prefix))
            seen["after"] = first_record(bootstrap, topic, job, _past(max(before["iterations"]["step"]) + 100),
                                         60, "probe-after")
        finally:
            hold.unlink(missing_ok=True)  # the job ends within one more epoch

    probe = threading.Thread(target=outage)
    probe.start()
    code, _seconds = launch(torchrun("train_ddp.py"), job, env)
    probe.join(60)
    broker = seen["broker"]
    try:
        assert code == 0
        assert seen.get("before") is not None, "no batch before the outage"
        assert seen.get("after") is not None, "no batch reached the restarted broker"
        steps = json.loads((tmp_path / "report.json").read_text())["steps"]
        records = consume_events(bootstrap, topic, job)
    finally:
        broker.stop()
    for rank in range(4):
        stats = json.loads((tmp_path / f"stats-{rank}.json").read_text())
        mine = sorted((r for r in records if r["rank"] == rank), key=lambda r: r["seq"])
        assert mine, f"rank {rank} never reconnected"
        assert stats["step"] == steps - 1
        # the batch built last (at exit) arrived, and its header carries the final drop count
        assert mine[-1]["seq"] == stats["batches_sent"] + stats["batches_failed"] - 1
        assert mine[-1]["dropped_events"] == stats["events_dropped"]
        assert max(s for r in mine for s in r["iterations"]["step"]) == steps - 1
        assert stats["wire_bytes"] > 0  # retries after the outage count: the ratio may pass 1
