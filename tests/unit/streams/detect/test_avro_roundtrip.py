"""Every record the engine emits encodes with the bundled schemas, and decoded records
(timestamp-millis as datetime) feed the next stage unchanged."""

from perftracker_ml.deploy.workloads.simulate.events import EventFault, EventJob, EventSimulator
from perftracker_ml.schemas.codec import MultiCodec
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.topology import LocalRunner

CODEC = MultiCodec(["FunctionPattern", "RankWindow", "FunctionComparison", "Anomaly", "Control"])


def roundtrip(name, rec):
    got_name, got = CODEC.decode(CODEC.encode(name, rec))
    assert got_name == name
    return got


def test_three_stages_through_avro():
    pol = DetectionPolicy(window_s=2.0, window_grace_s=1.0)
    sim = EventSimulator(EventJob(ranks=4), EventFault("slow-dataloader", 1, 12.0, start_s=4.0), seed=5)
    t0 = sim.t0_ns // 1_000_000
    runner = LocalRunner(pol, wire=roundtrip)  # every record between stages, and out of diagnose
    out = []
    for tick in range(1, 41):
        now = t0 + tick * 500
        while sim.clock.min() < tick * 0.5e9:
            sim.run_step()
        if tick % 2 == 0:
            for r in range(4):
                out += runner.feed(EVENT_BATCH, sim.batch(r, tick * 0.5e9), now)
        out += runner.tick(now)
    anomalies = [a for name, a in out if name == ANOMALY]
    opened = [a for a in anomalies if a["status"] == "OPEN"]
    assert [(a["ranks"], a["cause"]) for a in opened] == [([1], "slow_dataloader")]
