"""Every record the engine emits encodes with the bundled schemas, and decoded records
(timestamp-millis as datetime) feed the next stage unchanged."""

from perftracker.schemas.codec import MultiCodec
from perftracker.streams.detect import (
    DetectionPolicy,
    FunctionComparator,
    JobDiagnoser,
    RankSummarizer,
)

from benchmarks.simulate.events import EventFault, EventJob, EventSimulator

CODEC = MultiCodec(["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly", "Control"])


def roundtrip(name, rec):
    got_name, got = CODEC.decode(CODEC.encode(name, rec))
    assert got_name == name
    return got


def test_three_stages_through_avro():
    pol = DetectionPolicy(window_s=2.0, window_grace_s=1.0)
    sim = EventSimulator(EventJob(ranks=4), EventFault("slow-dataloader", 1, 12.0, start_s=4.0), seed=5)
    t0 = sim.t0_ns // 1_000_000
    summ = {r: RankSummarizer("job", r, pol) for r in range(4)}
    comps: dict[str, FunctionComparator] = {}
    diag = JobDiagnoser("job", pol)
    anomalies = []
    for tick in range(1, 41):
        now = t0 + tick * 500
        while sim.clock.min() < tick * 0.5e9:
            sim.run_step()
        for r, s in summ.items():
            if tick % 2 == 0:
                s.add_events(sim.batch(r, tick * 0.5e9))
            for name, rec in s.poll(now):
                rec = roundtrip(name, rec)
                if name == "FunctionPattern":
                    comps.setdefault(rec["function"], FunctionComparator("job", rec["function"], pol)).add(rec, now)
                else:
                    diag.add(name, rec, now)
        for c in comps.values():
            for rec in c.poll(now):
                diag.add("FunctionComparison", roundtrip("FunctionComparison", rec), now)
        a, ctl = diag.poll(now)
        anomalies += [roundtrip("Anomaly", x) for x in a]
        for x in ctl:
            roundtrip("Control", x)
    opened = [a for a in anomalies if a["status"] == "OPEN"]
    assert [(a["ranks"], a["cause"]) for a in opened] == [([1], "slow_dataloader")]
