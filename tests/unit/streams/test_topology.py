"""The topology declaration and its in-process runner: each record reaches the stage and key it names."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from perftracker_ml.schemas.vocabulary import (
    ANOMALY,
    CONTROL,
    EVENT_BATCH,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    FUNCTION_PATTERN_SET,
    HARDWARE_BATCH,
    RANK_WINDOW,
    RANK_WINDOW_SET,
)
from perftracker_ml.streams.detect import (
    DetectionPolicy,
    FunctionComparator,
    JobDiagnoser,
    RankSummarizer,
)
from perftracker_ml.streams.topology import (
    COMPARE,
    DIAGNOSE,
    STAGES,
    SUMMARIZE,
    TOPIC_KEY,
    TOPIC_OF,
    LocalRunner,
    Stage,
    TopicRole,
    message_key,
    records_on,
)

from .detect.synth import T0_WINDOW, W_MS, pattern, rank_window

POLICY = DetectionPolicy(window_s=5.0)


def test_stages_consume_distinct_topics_in_data_flow_order():
    assert [s.name for s in STAGES] == ["summarize", "compare", "diagnose"]
    assert [s.topic for s in STAGES] == [TopicRole.INPUTS, TopicRole.PATTERNS, TopicRole.FINDINGS]
    assert SUMMARIZE.poll_on_input and COMPARE.poll_on_input and DIAGNOSE.poll_on_input  # readiness on input


def test_every_record_has_a_topic_and_every_topic_a_key():
    assert records_on(TopicRole.INPUTS) == [EVENT_BATCH, HARDWARE_BATCH]
    assert records_on(TopicRole.PATTERNS) == [FUNCTION_PATTERN, FUNCTION_PATTERN_SET]
    assert records_on(TopicRole.FINDINGS) == [RANK_WINDOW, FUNCTION_COMPARISON, RANK_WINDOW_SET]
    assert records_on(TopicRole.ANOMALIES) == [ANOMALY]
    assert records_on(TopicRole.CONTROL) == [CONTROL]
    assert set(TOPIC_OF.values()) == set(TOPIC_KEY)


def test_message_keys_are_the_consuming_stage_keys():
    fp, rw = pattern(3, "Model.forward", 10.0), rank_window(3)
    assert message_key(FUNCTION_PATTERN, fp) == COMPARE.key(fp) == "job|Model.forward"
    assert message_key(RANK_WINDOW, rw) == DIAGNOSE.key(rw) == "job"
    assert message_key(ANOMALY, {"job": "job", "incident_id": "x"}) == "job"
    assert SUMMARIZE.key({"job": "job", "rank": "7"}) == "job|7"


def test_runner_sends_each_record_to_its_stage_key():
    runner = LocalRunner(POLICY)
    for job in ("a", "b"):
        for fn in ("f", "g"):
            assert runner.feed(FUNCTION_PATTERN, dict(pattern(0, fn, 1.0), job=job), 0) == []
        assert runner.feed(RANK_WINDOW, dict(rank_window(0), job=job), 0) == []
        runner.feed(EVENT_BATCH, {"job": job, "rank": 2}, 0)  # bad batch: counted by the core, not raised
    compare = runner.cores[COMPARE.name].by_key
    assert sorted(compare) == ["a|f", "a|g", "b|f", "b|g"]
    assert all(isinstance(c, FunctionComparator) and f"{c.job}|{c.function}" == k for k, c in compare.items())
    diagnose = runner.cores[DIAGNOSE.name].by_key
    assert sorted(diagnose) == ["a", "b"] and all(isinstance(d, JobDiagnoser) for d in diagnose.values())
    summarize = runner.cores[SUMMARIZE.name].by_key
    assert sorted(summarize) == ["a|2", "b|2"] and all(isinstance(s, RankSummarizer) for s in summarize.values())
    assert compare["a|f"].pending[T0_WINDOW][0]["function"] == "f"
    assert diagnose["b"].windows.rank_windows[T0_WINDOW][0]["job"] == "b"


def test_records_without_a_consuming_stage_leave_the_topology():
    runner = LocalRunner(POLICY)
    anomaly, control = {"job": "j", "status": "OPEN"}, {"job": "j", "command": "PROFILE"}
    assert runner.feed(ANOMALY, anomaly, 0) == [(ANOMALY, anomaly)]
    assert runner.feed(CONTROL, control, 0) == [(CONTROL, control)]


def test_a_tick_routes_comparisons_to_the_diagnoser_and_returns_anomalies():
    runner = LocalRunner(POLICY)
    seen: list[str] = []
    runner.wire = lambda name, rec: seen.append(name) or rec
    now = (T0_WINDOW + 1) * W_MS
    out = []
    for i in range(3):  # rank 5 twice as slow as its 15 peers, three windows running
        w, t = T0_WINDOW + i, now + i * W_MS
        for r in range(16):
            out += runner.feed(FUNCTION_PATTERN, pattern(r, "Model.forward", 20.0 if r == 5 else 10.0, window=w), t)
            out += runner.feed(RANK_WINDOW, rank_window(r, window=w, world=16), t)
        out += runner.tick(t + POLICY.grace_ms + 1)
        out += runner.tick(t + 3 * POLICY.grace_ms + 2000)
    assert seen.count(FUNCTION_COMPARISON) == 3  # one per window, handed from compare to diagnose
    opened = [a for name, a in out if name == ANOMALY and a["status"] == "OPEN"]
    assert [a["ranks"] for a in opened] == [[5]]


@dataclass
class Probe:
    """A core that records what it is given and returns what it is told to."""

    key: str
    fed: list = field(default_factory=list)
    returns: list = field(default_factory=list)
    quiet: bool = False
    skipped: Counter = field(default_factory=Counter)

    def idle(self, now_wall_ms: int) -> bool:
        return self.quiet


def probe_stage(name: str, topic: str, poll_on_input: bool = False) -> Stage[Probe]:
    return Stage(name=name, topic=topic, create=lambda rec, policy: Probe(rec["job"]),
                 feed=lambda core, n, rec, now: core.fed.append((n, rec["job"], now)),
                 poll=lambda core, now, flush: [core.returns.pop(0)] if core.returns else [],
                 poll_on_input=poll_on_input)


def test_poll_routes_downstream_polls_on_input_and_drops_idle_cores():
    first = probe_stage("first", TopicRole.PATTERNS, poll_on_input=True)
    second = probe_stage("second", TopicRole.FINDINGS)
    runner = LocalRunner(POLICY, stages=(first, second))
    runner.feed(FUNCTION_PATTERN, {"job": "j", "function": "f"}, 10)
    core = runner.cores["first"].by_key["j|f"]
    assert core.fed == [(FUNCTION_PATTERN, "j", 10)]
    core.returns = [(RANK_WINDOW, {"job": "j"}), (ANOMALY, {"job": "j"})]
    runner.feed(FUNCTION_PATTERN, {"job": "j", "function": "f"}, 11)  # polled on input: RankWindow moves on
    assert runner.cores["second"].by_key["j"].fed == [(RANK_WINDOW, "j", 11)]
    core.quiet = True
    assert runner.poll(first, 12) == [(ANOMALY, {"job": "j"})]
    assert runner.cores["first"].by_key == {}  # idle after its poll: dropped
