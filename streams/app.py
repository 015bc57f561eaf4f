"""Faust app factory: ``create_app(settings, bootstrap)`` builds one worker's app.

One agent and one timer per stage of :mod:`.topology` (built by :mod:`.agents.stage`):
they only decode, call the pure detection core in :mod:`.detect` and hand results on
to the topic and key the topology names; no business logic here.
Consumer-group and producer settings are tuned for real Kafka and keep the
local tansu broker happy (see docs/background.md): short session timeout so a joining
worker gets partitions fast, at-least-once (no transactions), no tables.
"""

from __future__ import annotations

from typing import Any

import faust

from ..schemas.http_auth import check_bind
from ..schemas.registry import RegistryMultiCodec, registry_client
from ..schemas.settings import Settings
from ..schemas.topics import TopicNames
from . import fetch_wait
from .agents import stage
from .context import StreamContext, topic_codecs
from .detect import DetectionPolicy
from .gaps import SummarizerGaps
from .kafka_auth import broker_credentials
from .metrics import register_metrics
from .topology import STAGES, SUMMARIZE, TopicRole
from .web import register_views, web_application_options


def role_topics(names: TopicNames) -> dict[str, tuple[str, ...]]:
    """The Kafka topic(s) of each topic role (the first one names its registry subject)."""
    return {
        TopicRole.INPUTS: (names.events, names.hardware),
        TopicRole.PATTERNS: (names.patterns,),
        TopicRole.FINDINGS: (names.findings,),
        TopicRole.ANOMALIES: (names.anomalies,),
        TopicRole.CONTROL: (names.control,),
    }


def stream_codecs(settings: Settings, names: TopicNames) -> dict[str, Any]:
    """With ``kafka.schema_registry_url``, the codec of each topic role that produces
    registry-framed records (the schemas of every topic the worker writes, all but its inputs,
    registered now: a registry that cannot be reached fails the worker's start, never a record
    later) and decodes both framings; without, {} (the context's plain codecs stay)."""
    client = registry_client(settings, server=True)
    if client is None:
        return {}
    codecs = topic_codecs(client, {role: topics[0] for role, topics in role_topics(names).items()})
    for role, codec in codecs.items():
        if role == TopicRole.INPUTS:
            continue
        if isinstance(codec, RegistryMultiCodec):
            codec.register_all()
        else:
            codec.schema_id  # noqa: B018 (registers the writer schema)
    return codecs


def create_app(settings: Settings, bootstrap: str, web_port: int | None = None) -> faust.App:
    """A Faust app with the summarize, compare and diagnose agents registered."""
    app = bare_app(settings, bootstrap, web_port)
    names = TopicNames.for_prefix(settings.kafka.topic_prefix)
    ctx = StreamContext(names=names, policy=DetectionPolicy.from_settings(settings.detection, settings.streams))
    ctx.codecs.update(stream_codecs(settings, names))
    def raw_topic(*topic_names: str) -> Any:
        return app.topic(*topic_names, key_type=bytes, value_type=bytes, key_serializer="raw",
                         value_serializer="raw", internal=False)

    ctx.topics = {role: raw_topic(*topics) for role, topics in role_topics(names).items()}
    ctx.topics["deadletter"] = raw_topic(names.deadletter)
    observers = {SUMMARIZE.name: SummarizerGaps(ctx.counters)}
    for i, s in enumerate(STAGES):
        stage.register(app, ctx, s, observers.get(s.name), upstream=tuple(u.topic for u in STAGES[:i]))
    register_views(app, ctx)
    register_metrics(app, ctx, settings.streams)
    return app


def bare_app(settings: Settings, bootstrap: str, web_port: int | None = None) -> faust.App:
    """The worker's Faust app with its consumer, producer and web settings, and no agents."""
    check_bind(settings.streams.web_host, settings.http_token, "streams.web_host")
    brokers = ";".join(f"kafka://{b.strip()}" for b in bootstrap.split(",") if b.strip())
    app = fetch_wait.App(
        settings.streams.app_id,
        broker=brokers,
        broker_credentials=broker_credentials(settings.kafka),
        store="memory://",
        processing_guarantee="at_least_once",
        topic_partitions=settings.kafka.partitions,
        topic_allow_declare=False,
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        broker_rebalance_timeout=10,
        broker_commit_interval=1.0,
        producer_linger=0.01,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        web_enabled=True,
        web_host=settings.streams.web_host,
        web_bind=settings.streams.web_host,  # Faust binds web_bind (default 0.0.0.0); web_host only names it
        web_application_options=web_application_options(settings.http_token),
        web_port=settings.streams.web_port if web_port is None else web_port,
        worker_redirect_stdouts=False,
        fetch_wait_ms=settings.streams.fetch_wait_ms,
    )
    return app
