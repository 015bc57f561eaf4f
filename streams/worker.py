"""`perftracker worker`: one production stream worker (a Faust worker in the consumer group)."""

from __future__ import annotations

import logging

from ..schemas.errors import ConfigError
from ..schemas.gc_policy import tune_gc
from ..schemas.http_auth import check_bind
from ..schemas.kafka_admin import TopicKeeper, ensure_topics
from ..schemas.logs import setup_logging
from ..schemas.settings import Settings
from ..schemas.stackfile import resolve_bootstrap
from ..schemas.topics import all_topics
from .detect import DetectionPolicy

log = logging.getLogger(__name__)


def run_worker(settings: Settings) -> None:
    """Check the settings and the broker, create missing topics, then run the Faust worker until stopped."""
    setup_logging(settings, "worker")
    DetectionPolicy.from_settings(settings.detection, settings.streams)  # a bad peer_groups fails here
    check_bind(settings.streams.web_host, settings.http_token, "streams.web_host")
    bootstrap = resolve_bootstrap(settings)
    if not bootstrap:
        raise ConfigError("no Kafka to connect to: set kafka.bootstrap_servers (or "
                          "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS), or start the embedded stack with `perftracker up`")
    conf = {**settings.kafka.client_conf(), "bootstrap.servers": bootstrap}
    topics = all_topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    ensure_topics(conf, topics)
    TopicKeeper(conf, topics).start()  # a restarted memory-only broker gets its topics back

    import faust  # imported after the broker check: a wrong address fails fast and clearly

    from .app import create_app
    from .kafka_auth import ignored_properties

    app = create_app(settings, bootstrap)
    if ignored_properties(settings.kafka):
        log.warning("kafka.librdkafka properties apply to librdkafka clients (collectors, sink), not to the "
                    "worker's aiokafka clients; not applied here: %s", ", ".join(ignored_properties(settings.kafka)))
    tune_gc(settings.streams.gc_young_objects)  # after start-up: what exists now is frozen
    worker = faust.Worker(app, loglevel=settings.log_level.lower(), redirect_stdouts=False,
                          override_logging=False)  # setup_logging did it
    worker.execute_from_commandline()
