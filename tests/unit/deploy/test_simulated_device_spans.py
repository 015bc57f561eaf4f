"""The workload simulators' GPU ranks send what a CUDA rank's collectors send: the device time
of forward, backward and the optimizer step (``SpanKind.DEVICE``, ``cuda:<host span name>``),
equal to the host time unless the GPU itself is slow; CPU ranks send none."""

from __future__ import annotations

from collections import defaultdict

import pytest
from perftracker_ml.collectors.cuda_timing import DEVICE_PREFIX
from perftracker_ml.deploy.workloads.simulate.events import EventFault, EventJob, EventSimulator
from perftracker_ml.deploy.workloads.simulate.faults import Fault
from perftracker_ml.deploy.workloads.simulate.layout import Layout
from perftracker_ml.deploy.workloads.simulate.patterns import PatternSim
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, SpanKind

DEVICE = int(SpanKind.DEVICE)


# -- SyntheticJob ------------------------------------------------------------------------------
def synthetic_spans(cfg: SyntheticJob) -> dict[int, dict[tuple[int, int], dict[str, tuple[int, int]]]]:
    """rank -> (step, kind) -> name -> (start_ns, dur_ns)."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for rank, rec in batches(cfg):
        s = rec["spans"]
        for kind, name, step, start, dur in zip(s["kind"], s["name"], s["step"], s["start_ns"], s["dur_ns"],
                                                strict=True):
            out[rank][(step, kind)][rec["names"][name]] = (start, dur)
    return out


def mean_ms(spans: dict, kind: int, name: str) -> float:
    durs = [by_name[name][1] for (_, k), by_name in spans.items() if k == kind and name in by_name]
    return sum(durs) / len(durs) / 1e6


HOST = {"forward": int(SpanKind.FORWARD), "backward": int(SpanKind.BACKWARD),
        "torch.optim.SGD.step": int(SpanKind.OPTIMIZER)}


def test_synthetic_gpu_ranks_send_a_device_span_per_compute_phase_equal_to_the_host_span():
    cfg = SyntheticJob("j", ranks=4, seconds=3, seed=1)
    spans = synthetic_spans(cfg)
    assert sorted(spans) == [0, 1, 2, 3]
    for by_step in spans.values():
        steps = {step for step, _ in by_step}
        for step in steps:
            device = by_step[(step, DEVICE)]
            assert set(device) == {DEVICE_PREFIX + n for n in HOST}
            for name, kind in HOST.items():
                assert device[DEVICE_PREFIX + name] == by_step[(step, kind)][name]  # same start, same time


def test_synthetic_slow_gpu_slows_the_device_span_and_the_host_waits_in_backward():
    cfg = SyntheticJob("j", ranks=8, seconds=5, slow_rank=3, slow_function="forward", slowdown=1.5, seed=2)
    spans = synthetic_spans(cfg)
    slow, peer = spans[3], spans[0]
    dev_fwd = mean_ms(slow, DEVICE, "cuda:forward")
    assert dev_fwd == pytest.approx(1.5 * mean_ms(peer, DEVICE, "cuda:forward"), rel=0.05)
    assert mean_ms(slow, HOST["forward"], "forward") == pytest.approx(mean_ms(peer, HOST["forward"], "forward"),
                                                                     rel=0.05)
    assert mean_ms(slow, HOST["torch.optim.SGD.step"], "torch.optim.SGD.step") == pytest.approx(
        mean_ms(slow, DEVICE, "cuda:torch.optim.SGD.step"))
    for (step, kind), by_name in slow.items():  # each step: host backward = device backward + forward's excess
        if kind == DEVICE:
            host_fwd, host_bwd = slow[(step, HOST["forward"])]["forward"][1], slow[(step, HOST["backward"])]["backward"][1]
            excess = by_name["cuda:forward"][1] - host_fwd
            assert excess > 0 and abs(host_bwd - by_name["cuda:backward"][1] - excess) <= 2


def test_synthetic_slow_dataloader_leaves_device_equal_to_host():
    spans = synthetic_spans(SyntheticJob("j", ranks=4, seconds=2, slow_rank=1, slow_function="dataloader"))
    for (step, kind), by_name in spans[1].items():
        if kind == DEVICE:
            assert by_name["cuda:forward"] == spans[1][(step, HOST["forward"])]["forward"]
            assert by_name["cuda:backward"] == spans[1][(step, HOST["backward"])]["backward"]


def test_synthetic_cpu_job_sends_no_device_spans_and_its_slow_function_is_slow_on_the_host():
    cfg = SyntheticJob("j", ranks=4, seconds=3, slow_rank=2, slow_function="forward", slowdown=1.5, gpu=False)
    recs = list(batches(cfg))
    assert all(r["gpu"] == -1 and DEVICE not in r["spans"]["kind"] for _, r in recs)
    assert not any(n.startswith(DEVICE_PREFIX) for _, r in recs for n in r["names"])
    spans = synthetic_spans(cfg)
    assert mean_ms(spans[2], HOST["forward"], "forward") == pytest.approx(
        1.5 * mean_ms(spans[0], HOST["forward"], "forward"), rel=0.05)


def test_synthetic_gpu_batches_are_valid_and_deterministic():
    cfg = SyntheticJob("j", ranks=2, seconds=2, slow_rank=1, seed=4)
    codec = Codec(EVENT_BATCH)
    first, second = list(batches(cfg)), list(batches(cfg))
    for (rank, a), (_, b) in zip(first, second, strict=True):
        assert validate(EVENT_BATCH, a) is None and as_lists(codec.decode(codec.encode(a)))["spans"] == a["spans"]
        assert a["gpu"] == rank and (a["spans"], a["comms"], a["iterations"]) == (b["spans"], b["comms"], b["iterations"])
        assert a["names"][a["comms"]["op"][0]] == "all_reduce"


# -- EventSimulator ----------------------------------------------------------------------------
def event_means(kind: str, gpu: bool = True, magnitude: float = 10.0, steps: int = 20) -> dict[int, dict]:
    """rank -> (span kind, name) -> mean ms over ``steps`` steps, plus "iter"."""
    sim = EventSimulator(EventJob(ranks=4, gpu=gpu), EventFault(kind, 1, magnitude), seed=3)
    for _ in range(steps):
        sim.run_step()
    out = {}
    for r in range(4):
        b = sim.batch(r, float(sim.clock.max()))
        acc: dict = defaultdict(list)
        for k, n, d in zip(b["spans"]["kind"], b["spans"]["name"], b["spans"]["dur_ns"], strict=True):
            acc[(k, b["names"][n])].append(d / 1e6)
        acc["iter"] = [d / 1e6 for d in b["iterations"]["dur_ns"]]
        out[r] = {k: sum(v) / len(v) for k, v in acc.items()}
        assert (b["gpu"] >= 0) == gpu  # one rank per host: GPU 0 each
    return out


EV_PHASES = {"Model.forward": int(SpanKind.FORWARD), "Model.backward": int(SpanKind.BACKWARD),
             "Optimizer.step": int(SpanKind.OPTIMIZER)}


@pytest.mark.parametrize("kind", ["none", "cpu-contention", "gc-storm", "slow-dataloader", "slow-collective"])
def test_events_device_time_is_the_host_time_unless_the_gpu_is_slow(kind: str):
    for r, m in event_means(kind).items():
        for name, host_kind in EV_PHASES.items():
            assert m[(DEVICE, DEVICE_PREFIX + name)] == pytest.approx(m[(host_kind, name)], abs=1e-6), (kind, r, name)


def test_events_slow_gpu_lands_on_the_device_and_the_host_waits_in_backward():
    healthy, slow = event_means("none"), event_means("slow-gpu", magnitude=10.0)
    s, h = slow[1], healthy[1]  # same seed: the same host draws, without and with the fault
    assert s[(3, "Model.forward")] == pytest.approx(h[(3, "Model.forward")])  # host launches, runs ahead
    assert s[(2, "Optimizer.step")] == pytest.approx(h[(2, "Optimizer.step")])
    excess = {n: s[(DEVICE, DEVICE_PREFIX + n)] - s[(k, n)] for n, k in EV_PHASES.items() if n != "Model.backward"}
    # 10 ms more per step on the device, spread over the phases by their times (forward 8, optimizer 3)
    assert 0 < excess["Optimizer.step"] < excess["Model.forward"] < 10.0
    # the host's backward holds forward's device excess (it waits there for the gradients)
    assert s[(4, "Model.backward")] - s[(DEVICE, "cuda:Model.backward")] == pytest.approx(excess["Model.forward"])
    assert s["iter"] == pytest.approx(h["iter"] + 10.0, rel=0.05)  # the job waits for the rank's device


def test_events_cpu_job_has_no_device_spans_and_refuses_a_slow_gpu():
    for m in event_means("cpu-contention", gpu=False).values():
        assert not any(k[0] == DEVICE for k in m if isinstance(k, tuple))
    with pytest.raises(ValueError):
        EventSimulator(EventJob(ranks=4), EventFault("slow-gpu", 1, 10.0))


# -- PatternSim --------------------------------------------------------------------------------
LAYOUT = Layout(dp=8, tp=1, pp=2)  # ranks 0-7 stage 0, 8-15 stage 1


def pattern_totals(faults: tuple[Fault, ...], windows: int = 5) -> dict[int, dict[int, dict[str, tuple]]]:
    """window -> rank -> function -> (kind, total_ns, count)."""
    sim = PatternSim(LAYOUT, faults, seed=5, spike_prob=0.0)
    out: dict = {}
    for w, recs in sim.windows(windows):
        per: dict = defaultdict(dict)
        for name, rec in recs:
            if name == "FunctionPattern":
                per[rec["rank"]][rec["function"]] = (rec["kind"], rec["total_ns"], rec["count"])
        out[w] = per
    return out


def pattern_phases(p: int) -> dict[str, str]:
    return {"fwd": f"PipelineStage{p}.forward", "bwd": f"PipelineStage{p}.backward", "opt": "Optimizer.step"}


def test_pattern_every_rank_reports_device_phases_equal_to_its_host_phases_when_healthy():
    totals = pattern_totals(())
    for per in totals.values():
        for rank, fns in per.items():
            for host in pattern_phases(rank // 8).values():
                kind, total, count = fns[DEVICE_PREFIX + host]
                assert kind == DEVICE and count > 0 and (total, count) == fns[host][1:]
            device_aggregates = {f for f, (k, _, _) in fns.items() if f.startswith("kind:") and k == DEVICE}
            assert device_aggregates == {"kind:device.forward", "kind:device.backward", "kind:device.optimizer"}
            assert fns["kind:device.forward"][1] == fns["kind:forward"][1]


@pytest.mark.parametrize("family", ["slow_gpu", "gpu_throttle"])
def test_pattern_gpu_fault_slows_the_device_and_the_host_waits_in_backward(family: str):
    totals = pattern_totals((Fault(family, (3,), magnitude=1.3, start_window=2),), windows=5)
    fns, peer = totals[3][3], totals[3][4]
    ph = pattern_phases(0)
    dev = {k: fns[DEVICE_PREFIX + n][1] / fns[DEVICE_PREFIX + n][2] for k, n in ph.items()}
    host = {k: fns[n][1] / fns[n][2] for k, n in ph.items()}
    peer_host = {k: peer[n][1] / peer[n][2] for k, n in ph.items()}
    assert dev["opt"] == pytest.approx(1.3 * host["opt"], rel=1e-6)  # host launches, runs ahead
    assert dev["fwd"] > 1.2 * host["fwd"] and host["fwd"] == pytest.approx(peer_host["fwd"], rel=0.1)
    assert host["bwd"] - dev["bwd"] == pytest.approx(dev["fwd"] - host["fwd"], rel=1e-6)
    assert dev["bwd"] > 1.2 * peer_host["bwd"]
    before = totals[0][3]
    assert before[DEVICE_PREFIX + ph["fwd"]][1:] == before[ph["fwd"]][1:]  # healthy before the fault


@pytest.mark.parametrize("fault", [Fault("cpu_contention", (3,), magnitude=1.5, start_window=1),
                                   Fault("stage_imbalance", stage=1, magnitude=1.5, start_window=1),
                                   Fault("creep", start_window=1), Fault("gc_pause", (3,), magnitude=30.0)])
def test_pattern_other_faults_keep_device_time_equal_to_host_time(fault: Fault):
    totals = pattern_totals((fault,), windows=4)
    for per in totals.values():
        for rank, fns in per.items():
            for host in pattern_phases(rank // 8).values():
                assert fns[DEVICE_PREFIX + host][1:] == fns[host][1:], (fault.family, rank, host)
    if fault.family == "cpu_contention":  # the culprit's host and device both slow
        fns, peer = totals[3][3], totals[3][4]
        d = DEVICE_PREFIX + pattern_phases(0)["fwd"]
        assert fns[d][1] / fns[d][2] > 1.1 * peer[d][1] / peer[d][2]


def test_pattern_is_deterministic_and_adds_three_device_patterns_per_rank_and_their_aggregates():
    a = pattern_totals((Fault("slow_gpu", (3,), start_window=1),), windows=3)
    assert a == pattern_totals((Fault("slow_gpu", (3,), start_window=1),), windows=3)
    for per in a.values():
        for fns in per.values():
            assert sum(k == DEVICE and not f.startswith("kind:") for f, (k, _, _) in fns.items()) == 3
