"""Faust app factory: ``create_app(settings, bootstrap)`` builds one worker's app.

The agents (one module each in :mod:`.agents`) only decode, call the pure
detection core in :mod:`.detect` and hand results on; no business logic here.
Consumer-group and producer settings are tuned for real Kafka and keep the
local tansu broker happy (see docs/background.md): short session timeout so a joining
worker gets partitions fast, at-least-once (no transactions), no tables.
"""

from __future__ import annotations

from typing import Any

import faust

from ..schemas.http_auth import check_bind
from ..schemas.registry import RegistryCodec, RegistryMultiCodec, registry_client
from ..schemas.settings import Settings
from ..schemas.topics import TopicNames
from ..schemas.vocabulary import (
    ANOMALY,
    CONTROL,
    EVENT_BATCH,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    HARDWARE_BATCH,
    RANK_WINDOW,
)
from .agents import compare, diagnose, summarize
from .context import StreamContext
from .detect import DetectionPolicy
from .kafka_auth import broker_credentials
from .metrics import register_metrics
from .web import register_views, web_application_options


def stream_codecs(settings: Settings, names: TopicNames) -> dict[str, Any]:
    """The agents' codecs: plain single-object ones, or with ``kafka.schema_registry_url`` ones that
    produce registry-framed records (their schemas registered now: a registry that cannot be reached
    fails the worker's start, never a record later) and decode both framings."""
    client = registry_client(settings)
    if client is None:
        return {}
    codecs: dict[str, Any] = {
        "inputs": RegistryMultiCodec([EVENT_BATCH, HARDWARE_BATCH], names.events, client),
        "pattern_codec": RegistryCodec(FUNCTION_PATTERN, names.patterns, client),
        "findings": RegistryMultiCodec([RANK_WINDOW, FUNCTION_COMPARISON], names.findings, client),
        "anomaly_codec": RegistryCodec(ANOMALY, names.anomalies, client),
        "control_codec": RegistryCodec(CONTROL, names.control, client),
    }
    for key in ("pattern_codec", "anomaly_codec", "control_codec"):
        codecs[key].schema_id  # noqa: B018 (registers the writer schema)
    codecs["findings"].register_all()
    return codecs


def create_app(settings: Settings, bootstrap: str, web_port: int | None = None) -> faust.App:
    """A Faust app with the summarize, compare and diagnose agents registered."""
    check_bind(settings.streams.web_host, settings.http_token, "streams.web_host")
    names = TopicNames.for_prefix(settings.kafka.topic_prefix)
    brokers = ";".join(f"kafka://{b.strip()}" for b in bootstrap.split(",") if b.strip())
    app = faust.App(
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
    )
    ctx = StreamContext(names=names, policy=DetectionPolicy.from_settings(settings.detection, settings.streams),
                        **stream_codecs(settings, names))
    def raw_topic(*topic_names: str) -> Any:
        return app.topic(*topic_names, key_type=bytes, value_type=bytes, key_serializer="raw",
                         value_serializer="raw", internal=False)

    ctx.topics = {
        "inputs": raw_topic(names.events, names.hardware),
        "patterns": raw_topic(names.patterns),
        "findings": raw_topic(names.findings),
        "anomalies": raw_topic(names.anomalies),
        "control": raw_topic(names.control),
        "deadletter": raw_topic(names.deadletter),
    }
    summarize.register(app, ctx)
    compare.register(app, ctx)
    diagnose.register(app, ctx)
    register_views(app, ctx)
    register_metrics(app, ctx, settings.streams)
    return app
