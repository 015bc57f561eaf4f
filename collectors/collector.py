"""The per-process collector: wires recorder, hooks, sender and the optional parts.

Only :func:`perftracker_ml.collectors.attach` creates one. Torch hooks go in as
soon as ``torch`` is imported (immediately if it already is), so a bootstrap
that attaches before the user's script runs never imports torch itself.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Protocol

from ..schemas import Codec
from ..schemas.codec import bundled_schemas
from ..schemas.registry import RegistryCodec, codec_for, registry_client
from ..schemas.spool import spool_dir
from ..schemas.topics import TopicNames
from ..schemas.vocabulary import EVENT_BATCH
from .batch import BatchBuilder
from .config import AttachSettings
from .counters import CollectorCounters
from .identity import RankIdentity
from .iteration import IterationDetector
from .job_agreement import JobAgreement, torch_distributed
from .patching import Patches, PostImportHook
from .recorder import Recorder
from .relay import RelaySink
from .safety import ErrorBudget
from .selfcost import background_cpu_by_thread
from .transport import KafkaSink, NullSink, Sender, SpoolSink

log = logging.getLogger("perftracker_ml.collectors")


@dataclass(frozen=True)
class CollectorStats:
    """The collector's own health, readable in-process with :func:`stats`."""

    job: str
    rank: int
    events_buffered: int
    events_sent: int
    events_dropped: int
    batches_sent: int
    batches_failed: int
    bytes_sent: int  # encoded batches delivered
    bytes_per_s: float
    wire_bytes: int  # written to the brokers: compressed, with Kafka framing (-1 unknown)
    wire_bytes_per_s: float
    wire_ratio: float  # wire bytes per encoded byte (-1 unknown)
    errors_caught: int
    gc_short_pauses: int
    step: int
    iteration_pattern: tuple[str, ...]
    torch_hooks: bool
    profile_windows: int
    profile_windows_dropped: int
    background_cpu_s: float  # CPU of the collector's own threads so far (-1 unknown)
    background_cpu_by_thread: dict[str, float]  # the same by thread (empty if unknown)


class Part(Protocol):
    """An optional part (profiler windows, control follower, NVML sampler): stopped at close."""

    def close(self) -> None: ...


class Collector:
    def __init__(self, settings: AttachSettings, identity: RankIdentity, bootstrap: str,
                 job_settled: bool = True):
        cfg = settings.collector
        self.settings = settings
        self.identity = identity
        self.counters = CollectorCounters()
        self.errors = ErrorBudget(cfg.log_every_s, self.counters)
        detector = IterationDetector(cfg.iteration_repeats, cfg.iteration_relearn)
        self.recorder = Recorder(cfg.buffer_events, detector, self.errors, self.counters)
        self.patches = Patches()
        self.imports = PostImportHook()
        self.topics = TopicNames.for_prefix(settings.kafka.topic_prefix)
        self.kafka_conf = {**settings.kafka.client_conf(), "bootstrap.servers": bootstrap}
        self.registry = registry_client(settings)  # None: single-object framing
        self.sink = self._make_sink(bootstrap)
        # the version written: the newest the stream workers read (a rollout keeps it at 7 until
        # every worker reads v8's packed columns)
        codec = self.codec(EVENT_BATCH, self.topics.events, max_version=cfg.event_batch_version)
        builder = BatchBuilder(identity, compact_groups=codec.version >= 9)  # v9: members as ranges
        self.sender = Sender(self.recorder, builder, codec.encode, self.sink, cfg,
                             identity.key)
        self.torch_hooks = False
        self._parts: list[Part] = []  # closed first to last
        self._removers: list[Callable[[], None]] = []
        self._pid = os.getpid()
        self._closed = False
        self._background_cpu: dict[str, float] | None = None  # frozen at close, before the threads end
        self._close_lock = threading.Lock()
        self._identity_listeners: list[Callable[[RankIdentity], None]] = []
        self.agreement: JobAgreement | None = None
        if not job_settled:
            self.agreement = JobAgreement(identity.job, self._agreed_job, cfg.job_agreement_s,
                                          torch_distributed)
            self.sender.add_task(self.agreement.poll)
            self.sender.hold_until(self.agreement.ready)

    def codec(self, record_name: str, topic: str, max_version: int | None = None) -> Codec | RegistryCodec:
        """The codec of ``record_name`` on ``topic``: registry-framed with a schema registry configured
        (the schema is registered on the first encode, in the sender's thread, never in training code);
        writing version ``max_version`` of it when given, else the newest."""
        schemas = None if max_version is None else bundled_schemas().restricted(record_name, max_version)
        return codec_for(self.settings, record_name, topic, client=self.registry, schemas=schemas)

    def _make_sink(self, bootstrap: str) -> KafkaSink | NullSink | SpoolSink | RelaySink:
        path = self.settings.collector.relay_socket
        if path and spool_dir(bootstrap) is None:  # the host's relay, Kafka directly when it does not take one
            try:
                return RelaySink(path, self.topics.events, self.counters, lambda: self._direct_sink(bootstrap),
                                 self.errors)
            except Exception as exc:  # noqa: BLE001
                self.errors.caught("relay", exc)
        return self._direct_sink(bootstrap)

    def _direct_sink(self, bootstrap: str) -> KafkaSink | NullSink | SpoolSink:
        on_lost = self.recorder.lost
        directory = spool_dir(bootstrap)
        if directory is not None:  # no broker: the messages go to local files (schemas.spool)
            try:
                return SpoolSink(directory, self.topics.events, self.counters, on_lost, self.errors)
            except Exception as exc:  # noqa: BLE001
                self.errors.caught("spool", exc)
                return NullSink(self.counters, on_lost)
        if not bootstrap:
            log.warning("perftracker: no Kafka broker configured (PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS "
                        "or `perftracker up`); events are counted, not sent")
            return NullSink(self.counters, on_lost)
        try:
            return KafkaSink(self.kafka_conf, self.topics.events, self.counters, on_lost, self.errors)
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("kafka producer", exc)
            return NullSink(self.counters, on_lost)

    # -- what the hooks and optional parts hand in ----------------------------------------
    def add_remover(self, remove: Callable[[], None]) -> None:
        """``remove()`` undoes one hook at :meth:`remove_hooks` (patches have their own undo)."""
        self._removers.append(remove)

    def add_part(self, part: Part, *, close_first: bool = False) -> None:
        """Close ``part`` at :meth:`close`, before the sender's last flush."""
        if close_first:
            self._parts.insert(0, part)
        else:
            self._parts.append(part)

    def set_identity(self, identity: RankIdentity) -> None:
        """A more precise identity (the GPU once NVML knows it, the agreed job) for later batches."""
        self.identity = identity
        self.sender.set_identity(identity)
        for listener in self._identity_listeners:
            listener(identity)

    def on_identity(self, listener: Callable[[RankIdentity], None]) -> None:
        """Call ``listener(identity)`` whenever the identity changes (parts that send on their own)."""
        self._identity_listeners.append(listener)

    def job_settled(self) -> bool:
        """False while the ranks still agree on the job id (see :mod:`.job_agreement`)."""
        return self.agreement is None or self.agreement.ready()

    def _agreed_job(self, job: str) -> None:
        self.set_identity(dataclasses.replace(self.identity, job=job))

    def start(self) -> None:
        from .hooks_python import GcTimer
        cfg = self.settings.collector
        if cfg.gc:
            gc_timer = GcTimer(self.recorder, int(cfg.gc_min_us * 1000))
            gc_timer.install()
            self.add_remover(gc_timer.remove)
        if cfg.cpu_evidence:
            self._start_cpu_evidence(cfg.stack_hz, cfg.user_code_paths)
        self.imports.when_imported("torch", self._on_torch)
        self.sender.start()
        if cfg.metrics_port > 0:
            self._serve_metrics(cfg.metrics_host, cfg.metrics_port + self.identity.local_rank)
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._after_fork_child)

    def _start_cpu_evidence(self, hz: float, user_code_paths: str) -> None:
        try:
            from .cpu_evidence import CpuEvidence
            from .stack_sampler import user_parts
            evidence = CpuEvidence(self.sender, self.counters, hz, user_code=user_parts(user_code_paths))
            evidence.start()
            self.add_part(evidence)
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("cpu evidence", exc)

    def _on_torch(self, torch: ModuleType) -> None:
        try:
            from .torch_hooks import install_torch_hooks
            install_torch_hooks(self, torch)
            self.torch_hooks = True
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("torch hooks", exc)

    def _serve_metrics(self, host: str, port: int) -> None:
        """The opt-in Prometheus endpoint (PERFTRACKER_COLLECTOR_METRICS_PORT + LOCAL_RANK)."""
        from ..schemas.metrics import MetricsServer, registry_of

        labels = {"training_job": self.identity.job, "rank": str(self.identity.rank)}
        try:
            server = MetricsServer(registry_of(self.counters, const_labels=labels), port, host)
        except ImportError:
            log.warning("perftracker: PERFTRACKER_COLLECTOR_METRICS_PORT is set but prometheus-client "
                        "is not installed (pip install prometheus-client); metrics endpoint off")
            return
        except OSError as exc:
            log.warning("perftracker: metrics endpoint on %s:%d not started: %s", host, port, exc)
            return
        self.add_part(server)
        log.info("perftracker: collector metrics at %s", server.url)

    def _after_fork_child(self) -> None:
        self.recorder.silence()
        self._closed = True  # the child has no sender thread; never flush from it

    def stats(self) -> CollectorStats:
        rec, counters = self.recorder, self.counters
        pattern = rec.detector.pattern or ()
        return CollectorStats(
            job=self.identity.job, rank=self.identity.rank, events_buffered=len(rec.events),
            events_sent=counters.events_sent, events_dropped=counters.events_dropped,
            batches_sent=counters.batches_sent, batches_failed=counters.batches_failed,
            bytes_sent=counters.sent_bytes, bytes_per_s=self.sender.bytes_per_s(),
            wire_bytes=counters.wire_bytes, wire_bytes_per_s=self.sender.wire_bytes_per_s(),
            wire_ratio=round(self.sender.wire_ratio(), 4),
            errors_caught=counters.errors_caught, step=rec.step,
            gc_short_pauses=counters.gc_short_pauses,
            iteration_pattern=tuple(t.name for t in pattern), torch_hooks=self.torch_hooks,
            profile_windows=counters.profile_windows, profile_windows_dropped=counters.profile_windows_dropped,
            **_background(self._background_cpu if self._closed else background_cpu_by_thread()))

    def close(self) -> None:
        """Stop everything and flush for at most ``exit_flush_s``. Idempotent, never raises."""
        with self._close_lock:
            if self._closed or os.getpid() != self._pid:
                return
            self._closed = True
        try:
            self._background_cpu = background_cpu_by_thread()
            for part in self._parts:
                part.close()
            self.sender.close(self.settings.collector.exit_flush_s)
            if self.settings.collector.stats_file:
                self._write_stats(self.settings.collector.stats_file)
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("close", exc)

    def _write_stats(self, template: str) -> None:
        path = template.format(rank=self.identity.rank, pid=os.getpid(), job=self.identity.job)
        with open(path, "w") as f:
            json.dump(asdict(self.stats()), f)

    def remove_hooks(self) -> None:
        """Undo every patch (tests and :func:`detach`)."""
        for remove in self._removers:
            try:
                remove()
            except Exception as exc:  # noqa: BLE001
                self.errors.caught("remove", exc)
        self._removers.clear()
        self.patches.undo()
        self.imports.remove()


def _background(by_thread: dict[str, float] | None) -> dict[str, Any]:
    if by_thread is None:
        return {"background_cpu_s": -1.0, "background_cpu_by_thread": {}}
    return {"background_cpu_s": sum(by_thread.values()),
            "background_cpu_by_thread": {k: round(v, 3) for k, v in sorted(by_thread.items())}}
