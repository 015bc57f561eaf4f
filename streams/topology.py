"""The detection topology, declared once: the keyed stages and where each record goes.

::

    topic      records                                key            stage      core per key
    inputs     EventBatch, HardwareBatch              job|rank       summarize  RankSummarizer
    patterns   FunctionPattern(Set)                   job|function   compare    FunctionComparator
    findings   RankWindow(Set), FunctionComparison    job            diagnose   JobDiagnoser
    anomalies  Anomaly                                job            (leaves: sinks, alerts)
    control    Control                                job            (leaves: collectors)

A record travels on the topic :data:`TOPIC_OF` names it, keyed by that topic's key
function (:data:`TOPIC_KEY`), so all records of one stage key reach the same worker and
the same core. A stage holds one core per key (:class:`Cores`), created from the first
record of the key; it feeds every input record to its core, polls each core fed at the end
of the input's chunk (a window is evaluated as soon as every rank has reported it) and, each
:data:`POLL_INTERVAL_S`, every core with something due (the timer covers the grace of a
missing rank; :meth:`Cores.due`), and routes
what the polls return, and drops a core once it reports idle after a poll.

Two runners run this declaration: the Faust app (``perftracker_ml.streams.agents``, one
agent and one timer per stage) and :class:`LocalRunner` (in process, caller's clock:
the trace importer, the detection benchmark's simulator, tests). No Faust or Kafka here.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from ..schemas.record_sets import expanded, in_sets
from ..schemas.records import FunctionComparison, FunctionPattern, RankWindow, StageRecord
from ..schemas.vocabulary import (
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
from .detect import DetectionPolicy, FunctionComparator, JobDiagnoser, RankSummarizer
from .detect.chunk_fold import ChunkResult
from .detect.compare import caught_up_ms
from .detect.job_clock import Due, JobClock, JobClocks
from .detect.summarize import add_batches, poll_many

POLL_INTERVAL_S = 0.5  # every stage's timer

Record = Mapping[str, Any]  # a decoded record of any topic (TypedDicts included)
Routed = tuple[str, StageRecord]  # (record name, record) a stage hands on


class TopicRole:
    """Which topic a record travels on; the Faust app maps each role to its Kafka topic name(s)."""

    INPUTS = "inputs"
    PATTERNS = "patterns"
    FINDINGS = "findings"
    ANOMALIES = "anomalies"
    CONTROL = "control"


TOPIC_OF: dict[str, str] = {
    EVENT_BATCH: TopicRole.INPUTS, HARDWARE_BATCH: TopicRole.INPUTS,
    FUNCTION_PATTERN: TopicRole.PATTERNS, FUNCTION_PATTERN_SET: TopicRole.PATTERNS,
    RANK_WINDOW: TopicRole.FINDINGS, FUNCTION_COMPARISON: TopicRole.FINDINGS, RANK_WINDOW_SET: TopicRole.FINDINGS,
    ANOMALY: TopicRole.ANOMALIES,
    CONTROL: TopicRole.CONTROL,
}


def by_job_rank(r: Record) -> str:
    return f"{r['job']}|{int(r['rank'])}"


def by_job_function(r: Record) -> str:
    return f"{r['job']}|{r['function']}"


def by_job(r: Record) -> str:
    return str(r["job"])


TOPIC_KEY: dict[str, Callable[[Record], str]] = {
    TopicRole.INPUTS: by_job_rank, TopicRole.PATTERNS: by_job_function, TopicRole.FINDINGS: by_job,
    TopicRole.ANOMALIES: by_job, TopicRole.CONTROL: by_job,
}


def records_on(topic: str) -> list[str]:
    """Names of the records that travel on ``topic``, in declaration order."""
    return [name for name, t in TOPIC_OF.items() if t == topic]


def message_key(name: str, record: Record) -> str:
    """The key a record named ``name`` is sent with (its topic's key)."""
    return TOPIC_KEY[TOPIC_OF[name]](record)


class Core(Protocol):
    skipped: collections.Counter[str]  # what the core set aside, by reason

    def idle(self, now_wall_ms: int) -> bool: ...

    # optional: ``due() -> Due`` (streams/detect/job_clock.py): when a timer poll may next do
    # something; a core without it is polled on every tick


C = TypeVar("C", bound=Core)


@dataclass(frozen=True)
class Stage(Generic[C]):
    """One keyed stage: what it consumes and how it drives its core. ``poll_on_input``:
    poll a core right after feeding it too (not only on the timer)."""

    name: str  # agent ``perftracker.<name>``; error counters ``<name>`` and ``<name>.tick``
    topic: str  # the topic role it consumes; its key is the stage key
    create: Callable[..., C]  # (record, policy[, job clock]) -> the core of a new key, from its first record
    feed: Callable[[C, str, Record, int], None]  # (core, record name, record, now ms)
    poll: Callable[[C, int, bool], list[Routed]]  # (core, now ms, flush) -> records to route
    poll_on_input: bool = False
    # optional: feed a chunk of (core, record name, record) at once, each key's in order (the
    # agent then polls each core fed once, at the chunk's end); what it returns is ignored
    # except a ``failure`` attribute (an unexpected error it recovered from, to be counted)
    # and a ``failed`` one (the errors of records it left out, each counted as a failed record)
    feed_chunk: Callable[[list[tuple[C, str, Record]], int], Any] | None = None
    # the cores of one job share a JobClock (streams/detect/job_clock.py) whose caught-up bound is
    # ``job_clock(policy)`` ms; ``create`` then takes it as a third argument
    job_clock: Callable[[DetectionPolicy], int] | None = None
    # optional: the records a core holds waiting (its backlog): past ``shed_backlog_records`` over the
    # stage's cores, whole keys are shed (:meth:`Cores.shed`)
    backlog: Callable[[C], int] | None = None
    # optional: poll many cores at once, as ``poll`` of each in order would (the records of all
    # made together); returns (records, the errors of the cores or windows that failed)
    poll_many: Callable[[list[C], int, bool], tuple[list[Routed], list[Exception]]] | None = None

    def key(self, record: Record) -> str:
        return TOPIC_KEY[self.topic](record)

    def poll_all(self, cores: list[C], now_ms: int, flush: bool) -> tuple[list[Routed], list[Exception]]:
        """``poll`` of each core, in order: at once with ``poll_many``, else one by one (a core
        whose poll raises is left out, its error returned)."""
        if self.poll_many is not None:
            return self.poll_many(cores, now_ms, flush)
        out: list[Routed] = []
        failed: list[Exception] = []
        for core in cores:
            try:
                out += self.poll(core, now_ms, flush)
            except Exception as exc:
                failed.append(exc)
        return out, failed


# The adapters below are where decoded dicts (checked against their schema by the codec)
# meet the core: the record name says which TypedDict a record is.
def _feed_summarize(s: RankSummarizer, name: str, record: Record, now: int) -> None:
    batch = cast(dict, record)  # EventBatch and HardwareBatch stay untyped dicts
    if name == HARDWARE_BATCH:
        s.add_hardware(batch, now)
    else:
        s.add_events(batch, now)


def _feed_summarize_chunk(items: list[tuple[RankSummarizer, str, Record]], now: int) -> ChunkResult:
    return add_batches([(s, name == HARDWARE_BATCH, cast(dict, r)) for s, name, r in items], now)


@dataclass
class FedEach:
    """What :func:`feed_each` did: the errors of the records whose feed raised (left out)."""

    failed: list[Exception]


def feed_each(feed: Callable[[C, str, Record, int], None]) -> Callable[[list[tuple[C, str, Record]], int], FedEach]:
    """A stage's ``feed_chunk`` that feeds each record in turn: the agent then polls each core once
    at the chunk's end instead of after every record (a poll, and rescheduling its core, costs
    what a record's feed does: most of the compare stage's time when polled per record). A window
    is evaluated with at least the records it had a record earlier: a core's windows wait for
    their ranks or their timers, and the chunk's later records only add to them."""
    def fed(items: list[tuple[C, str, Record]], now: int) -> FedEach:
        failed = []
        for core, name, record in items:
            try:
                feed(core, name, record, now)
            except Exception as exc:  # one bad record is left out and counted, the chunk goes on
                failed.append(exc)
        return FedEach(failed)
    return fed


def _feed_compare(c: FunctionComparator, name: str, record: Record, now: int) -> None:
    c.add(cast(FunctionPattern, record), now)


def _feed_diagnose(d: JobDiagnoser, name: str, record: Record, now: int) -> None:
    d.add(name, cast(RankWindow | FunctionComparison, record), now)


def _poll_summarize(s: RankSummarizer, now: int, flush: bool) -> list[Routed]:
    return list(s.poll(now, flush=flush))  # FunctionPatterns, then the RankWindow, per window


def _poll_summarizers(ss: list[RankSummarizer], now: int, flush: bool) -> tuple[list[Routed], list[Exception]]:
    """Every summarizer's poll at once; the FunctionPatterns of one function and the RankWindows
    of one job closed together for a window go as one set (schemas/record_sets.py,
    ``record_set_min``), or, should packing them fail, each alone (the failure counted with the
    poll's)."""
    out, failed = poll_many(ss, now, flush)
    if not ss:
        return list(out), failed
    try:
        return cast(list[Routed], in_sets(out, ss[0].policy.record_set_min)), failed
    except Exception as exc:  # a defect in the packing must not cost the poll's records
        return list(out), [*failed, exc]


def _poll_compare(c: FunctionComparator, now: int, flush: bool) -> list[Routed]:
    return [(FUNCTION_COMPARISON, r) for r in c.poll(now)]


def _poll_diagnose(d: JobDiagnoser, now: int, flush: bool) -> list[Routed]:
    anomalies, controls = d.poll(now)
    return [(ANOMALY, a) for a in anomalies] + [(CONTROL, c) for c in controls]


SUMMARIZE: Stage[RankSummarizer] = Stage(
    name="summarize", topic=TopicRole.INPUTS,
    create=lambda r, policy, clock: RankSummarizer(r["job"], int(r["rank"]), policy, clock),
    feed=_feed_summarize, poll=_poll_summarize, poll_on_input=True, feed_chunk=_feed_summarize_chunk,
    job_clock=lambda policy: policy.grace_ms, poll_many=_poll_summarizers)  # batches come each second: 3 s behind is behind
COMPARE: Stage[FunctionComparator] = Stage(
    name="compare", topic=TopicRole.PATTERNS,
    create=lambda r, policy, clock: FunctionComparator(r["job"], r["function"], policy, clock),
    feed=_feed_compare, poll=_poll_compare, poll_on_input=True, job_clock=caught_up_ms,
    feed_chunk=feed_each(_feed_compare))
DIAGNOSE: Stage[JobDiagnoser] = Stage(
    name="diagnose", topic=TopicRole.FINDINGS,
    create=lambda r, policy, clock: JobDiagnoser(r["job"], policy, clock),
    feed=_feed_diagnose, poll=_poll_diagnose, poll_on_input=True, job_clock=caught_up_ms,
    backlog=lambda d: d.windows.held(), feed_chunk=feed_each(_feed_diagnose))
STAGES: tuple[Stage[Any], ...] = (SUMMARIZE, COMPARE, DIAGNOSE)  # in data-flow order


ClockKey = tuple[str, int | None]  # (job, input partition)
Entry = tuple[int, int, str]  # (time, version, key) in a due queue


class Cores(Generic[C]):
    """The cores one stage holds, by stage key (one worker's share of the keys).

    **Which cores a timer tick polls** (:meth:`due`). A tick used to poll every core: 7 us a
    rank with nothing to close, 58-84 ms a tick at 8,192 idle ranks. Now each core says, after
    each time it is fed or polled, when a poll may next do something without input of its own
    (``due()``, a :class:`.detect.job_clock.Due`: a caller time, a caller time that counts only
    while its job's clock lets the caller's clock decide, a data time its job's clock must pass),
    and the stage keeps three due queues (heaps): one by caller time, and per job clock one by
    caller time and one by data time. A tick pops what is due -- the caller-time queue up to
    now, each clock's wall queue only while ``clock.by_wall(now)``, its data queue while
    ``clock.data_past(top)`` -- and polls those cores, in the order the cores were created (the
    order every tick polled them in before). A poll that is not due does nothing, so the
    records, their order and every verdict are the same; the tick's work is the windows due
    plus one check per job clock, whatever the number of ranks held. A core without ``due()``
    (and every core of a stage without job clocks) is polled on every tick, as before.
    """

    def __init__(self, stage: Stage[C], policy: DetectionPolicy):
        self.stage, self.policy = stage, policy
        self.by_key: dict[str, C] = {}
        self.clocks = JobClocks(policy, stage.job_clock(policy) if stage.job_clock else None)
        self._per_clock: dict[ClockKey, int] = {}  # cores holding each clock
        self._clock_of: dict[str, ClockKey] = {}  # key -> its clock's key
        self.retired: collections.Counter[str] = collections.Counter()  # skipped by cores dropped since
        self.retired_decisions: collections.Counter[tuple[str, str]] = collections.Counter()  # theirs too
        self._order: dict[str, int] = {}  # key -> creation number: the order cores are polled in
        self._created = 0
        self._always: set[str] = set()  # cores that cannot tell when they are due: every tick
        self._version: dict[str, int] = {}  # key -> version of its live queue entries
        self._at: list[Entry] = []  # due at a caller time
        self._wall: dict[ClockKey, list[Entry]] = {}  # due at a caller time once the clock allows
        self._data: dict[ClockKey, list[Entry]] = {}  # due once the clock's data is past a point
        self._entries = 0  # queue entries, void ones included (compacted when they pile up)

    def skipped(self) -> collections.Counter[str]:
        """What the stage's cores set aside (late, evicted, malformed ...), by reason, since the start."""
        total = collections.Counter(self.retired)
        for core in self.by_key.values():
            total.update(core.skipped)
        return total

    def decisions(self) -> collections.Counter[tuple[str, str]]:
        """The diagnosis rules' decisions of the stage's cores, by (rule, outcome), since the start
        (cores without a decision trace: none)."""
        total = collections.Counter(self.retired_decisions)
        for core in self.by_key.values():
            total.update(getattr(core, "decisions", None) or {})
        return total

    def for_record(self, record: Record, partition: int | None = None) -> C:
        """The core of ``record``'s key (created from it when new); ``partition``: the input
        partition it was read from, whose cores of the same job share a clock (None: one per job)."""
        key = self.stage.key(record)
        core = self.by_key.get(key)
        if core is None:
            if self.stage.job_clock is None:
                core = self.stage.create(record, self.policy)
            else:
                clock_key = (str(record["job"]), partition)
                core = self.stage.create(record, self.policy, self.clocks.of(*clock_key))
                self._per_clock[clock_key] = self._per_clock.get(clock_key, 0) + 1
                self._clock_of[key] = clock_key
            self.by_key[key] = core
            self._order[key] = self._created
            self._created += 1
        return core

    def key_of(self, record: Record) -> str:
        return self.stage.key(record)

    def schedule(self, key: str, core: C) -> None:
        """Queue ``core`` for the tick at which it is next due (after it was fed or polled)."""
        due_of = getattr(core, "due", None)
        clock_key = self._clock_of.get(key)
        if due_of is None or clock_key is None:
            self._always.add(key)
            return
        try:
            due: Due = due_of()
        except Exception:  # a core in a bad state: polled on every tick, as before
            self._always.add(key)
            return
        self._always.discard(key)
        version = self._version.get(key, 0) + 1
        self._version[key] = version
        for t, queue in ((due.at, self._at), (due.wall, self._wall.setdefault(clock_key, [])),
                         (due.data, self._data.setdefault(clock_key, []))):
            if t is not None:
                heapq.heappush(queue, (int(t), version, key))
                self._entries += 1
        if self._entries > 4 * len(self.by_key) + 1024:
            self._compact()

    def due(self, now_ms: int) -> list[tuple[str, C]]:
        """The cores a timer tick at ``now_ms`` polls (see the class docstring), in creation order;
        each is queued again by :meth:`polled`."""
        keys = set(self._always)
        self._pop(self._at, lambda t: t <= now_ms, keys)
        for clock_key, queue in self._wall.items():
            clock = self.clocks.by_job.get(clock_key)
            if clock is None or clock.by_wall(now_ms):
                self._pop(queue, lambda t: t <= now_ms, keys)
        for clock_key, queue in self._data.items():
            clock = self.clocks.by_job.get(clock_key)
            if clock is not None:
                self._pop(queue, clock.data_past, keys)
        for key in keys:  # their other entries are void: queued afresh once polled
            self._version[key] = self._version.get(key, 0) + 1
        due = [(k, self.by_key[k]) for k in keys if k in self.by_key]
        due.sort(key=lambda kc: self._order[kc[0]])
        return due

    def _pop(self, queue: list[Entry], ready: Callable[[int], bool], keys: set[str]) -> None:
        while queue and ready(queue[0][0]):
            _, version, key = heapq.heappop(queue)
            self._entries -= 1
            if self._version.get(key) == version:
                keys.add(key)

    def _compact(self) -> None:
        """Drop the void entries of every queue."""
        def live(queue: list[Entry]) -> list[Entry]:
            kept = [e for e in queue if self._version.get(e[2]) == e[1]]
            heapq.heapify(kept)
            return kept

        self._at = live(self._at)
        self._wall = {k: live(q) for k, q in self._wall.items() if k in self.clocks.by_job}
        self._data = {k: live(q) for k, q in self._data.items() if k in self.clocks.by_job}
        self._entries = len(self._at) + sum(map(len, self._wall.values())) + sum(map(len, self._data.values()))

    def polled(self, key: str, core: C, now_ms: int) -> bool:
        """After a timer poll of ``core``: drop it when idle (True), else queue it again."""
        if self.drop_if_idle(key, core, now_ms):
            return True
        self.schedule(key, core)
        return False

    def clock(self, job: str, partition: int | None = None) -> JobClock | None:
        """The shared clock of ``job`` (and partition) on this stage (None: none shared, or no such job)."""
        return self.clocks.by_job.get((job, partition))

    def items(self) -> list[tuple[str, C]]:
        return list(self.by_key.items())

    def drop_if_idle(self, key: str, core: C, now_ms: int) -> bool:
        """Drop the core of ``key`` when it reports idle; whether it was dropped."""
        if not core.idle(now_ms):
            return False
        self._drop(key, core)
        return True

    def shed(self) -> list[tuple[str, int]]:
        """Overload: while the records the stage's cores hold waiting (``Stage.backlog``) exceed the
        policy's ``shed_backlog_records``, drop the core holding the most, whole (a job of the diagnose
        stage: its windows and incidents; records of it that come later start it afresh). The largest
        goes first: one giant job behind is shed before the many it would starve. Returns (key,
        records dropped) of each, for the caller to count."""
        bound = self.policy.shed_backlog_records
        if self.stage.backlog is None or bound <= 0:
            return []
        held = {key: int(self.stage.backlog(core)) for key, core in self.by_key.items()}
        total, out = sum(held.values()), []
        for key in sorted(held, key=lambda k: (-held[k], self._order[k])):
            if total <= bound:
                break
            out.append((key, held[key]))
            total -= held[key]
            self._drop(key, self.by_key[key])
        return out

    def _drop(self, key: str, core: C) -> None:
        del self.by_key[key]
        self.retired.update(core.skipped)
        self.retired_decisions.update(getattr(core, "decisions", None) or {})
        self._order.pop(key, None)
        self._version.pop(key, None)  # its queue entries are void
        self._always.discard(key)
        clock_key = self._clock_of.pop(key, None)
        if clock_key is not None:
            self._per_clock[clock_key] -= 1
            if not self._per_clock[clock_key]:  # the clock's last core: the clock goes with it
                del self._per_clock[clock_key]
                self.clocks.by_job.pop(clock_key, None)
                self._wall.pop(clock_key, None)
                self._data.pop(clock_key, None)


class LocalRunner:
    """Runs :data:`STAGES` in process on the caller's clock, routing as the Faust app does.

    ``feed`` delivers one record to the stage that consumes its topic; ``poll`` is one
    timer tick of one stage, ``tick`` one of every stage in data-flow order. All return the
    records that leave the topology (Anomaly, Control). ``wire`` (optional) is applied to
    every routed record, e.g. an Avro round trip. Unlike the Faust agents, which count and
    skip a failing message, the runner lets an exception propagate."""

    def __init__(self, policy: DetectionPolicy, stages: Iterable[Stage[Any]] = STAGES,
                 wire: Callable[[str, Any], Any] | None = None):
        self.cores: dict[str, Cores[Any]] = {s.name: Cores(s, policy) for s in stages}
        self._by_topic = {c.stage.topic: c for c in self.cores.values()}
        self.wire = wire
        self.shed: collections.Counter[str] = collections.Counter()  # keys shed under overload, by stage

    def feed(self, name: str, record: Record, now_ms: int) -> list[Routed]:
        cores = self._by_topic.get(TOPIC_OF[name])
        if cores is None:
            return [(name, cast(StageRecord, record))]
        core = cores.for_record(record)
        key = cores.key_of(record)
        cores.stage.feed(core, name, record, now_ms)
        if not cores.stage.poll_on_input:
            cores.schedule(key, core)
            return []
        out = cores.stage.poll(core, now_ms, False)
        cores.schedule(key, core)
        self.shed[cores.stage.name] += len(cores.shed())
        return self._route(out, now_ms)

    def feed_chunk(self, records: list[tuple[str, Record]], now_ms: int) -> list[Routed]:
        """Deliver records of one topic as the agent delivers a chunk: at once to a stage with
        ``feed_chunk`` (each core fed then polled once), else one by one."""
        cores = self._by_topic.get(TOPIC_OF[records[0][0]]) if records else None
        if cores is None or cores.stage.feed_chunk is None:
            return [r for name, record in records for r in self.feed(name, record, now_ms)]
        items: list[tuple[Any, str, Record]] = []
        fed: dict[str, Any] = {}
        for name, record in records:
            core = cores.for_record(record)
            items.append((core, name, record))
            fed.setdefault(cores.key_of(record), core)
        result = cores.stage.feed_chunk(items, now_ms)
        if getattr(result, "failed", None):
            raise result.failed[0]
        out: list[Routed] = []
        if cores.stage.poll_on_input:
            out, failed = cores.stage.poll_all(list(fed.values()), now_ms, False)
            if failed:
                raise failed[0]
        for key, core in fed.items():
            cores.schedule(key, core)
        self.shed[cores.stage.name] += len(cores.shed())
        return self._route(out, now_ms)

    def poll(self, stage: Stage[Any], now_ms: int, flush: bool = False) -> list[Routed]:
        """One timer tick of ``stage``: the cores due (:meth:`Cores.due`); ``flush``: every core."""
        cores = self.cores[stage.name]
        due = cores.items() if flush else cores.due(now_ms)
        out, failed = cores.stage.poll_all([core for _, core in due], now_ms, flush)
        if failed:
            raise failed[0]
        for key, core in due:
            cores.polled(key, core, now_ms)
        return self._route(out, now_ms)

    def tick(self, now_ms: int) -> list[Routed]:
        return [r for cores in list(self.cores.values()) for r in self.poll(cores.stage, now_ms)]

    def _route(self, records: list[Routed], now_ms: int) -> list[Routed]:
        """Deliver what a stage handed on as the agents take it: each topic's records in one chunk
        (in their order; topics in the order they first appear), so a downstream core is polled
        once per chunk, as the worker's agents poll it."""
        by_topic: dict[str, list[tuple[str, Record]]] = {}
        for name, record in records:  # a set read as its records, as the agents read it
            by_topic.setdefault(TOPIC_OF[name], []).extend(expanded(name, self.wire(name, record) if self.wire else record))
        leaving = []
        for chunk in by_topic.values():
            leaving += self.feed_chunk(chunk, now_ms)
        return leaving
