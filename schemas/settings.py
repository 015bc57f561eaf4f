"""Every perftracker setting, declared once: section, name, type, default and doc.

A setting's environment variable is ``PERFTRACKER_<SECTION>_<NAME>`` in upper
case (``PERFTRACKER_<NAME>`` for the top-level ones); the environment wins over
the config file. Secrets (:class:`Secret`) come from the environment or from a
file named by ``<name>_file`` and never appear in reprs or errors. A numeric
field declares its allowed range in its metadata (``ge``, ``gt``, ``le``, ``lt``:
counts >= 1, durations > 0 or >= 0 where 0 means off, ports 0..65535), checked
by the loader for every source. Loading is
:mod:`.settings_loader`'s job (call it from ``main()``): the servers validate
through pydantic-settings with models generated from these dataclasses
(:mod:`.settings_model`), the collectors with the standard library; either way
the result is these dataclasses. `perftracker config` lists every field below.
This module is the bottom of the layering: any package may import it, and it
imports the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _secret() -> Secret:
    return Secret("")


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = field(default="", metadata={"doc": "host:port list; empty = the embedded broker from `perftracker up`"})
    topic_prefix: str = field(default="pt", metadata={"doc": "prefix of every topic name"})
    partitions: int = field(default=8, metadata={"ge": 1, "doc": "partitions of the keyed topics (created at start-up)"})
    security_protocol: str = field(default="PLAINTEXT", metadata={"doc": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"})
    sasl_mechanism: str = field(default="", metadata={"doc": "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL_* protocol)"})
    sasl_username: str = field(default="", metadata={"doc": "SASL user (PLAIN, SCRAM)"})
    sasl_password: Secret = field(default_factory=_secret, metadata={"doc": "SASL password (PLAIN, SCRAM; env or *_file only)"})
    sasl_oauthbearer_token_endpoint_url: str = field(default="", metadata={"doc": "OAUTHBEARER: OIDC token endpoint (client credentials grant)"})
    sasl_oauthbearer_client_id: str = field(default="", metadata={"doc": "OAUTHBEARER: OIDC client id"})
    sasl_oauthbearer_client_secret: Secret = field(default_factory=_secret, metadata={"doc": "OAUTHBEARER: OIDC client secret (env or *_file only)"})
    sasl_oauthbearer_scope: str = field(default="", metadata={"doc": "OAUTHBEARER: scope requested with the token (space-separated; empty = none)"})
    ssl_ca_location: str = field(default="", metadata={"doc": "CA bundle (PEM) the broker certificates are checked against; empty = the system's"})
    ssl_certificate_location: str = field(default="", metadata={"doc": "client certificate (PEM) for TLS client authentication"})
    ssl_key_location: str = field(default="", metadata={"doc": "client private key (PEM) of ssl_certificate_location"})
    ssl_key_password: Secret = field(default_factory=_secret, metadata={"doc": "password of an encrypted ssl_key_location (env or *_file only)"})
    ssl_verify: bool = field(default=True, metadata={"doc": "verify the broker's certificate and host name (false only for tests)"})
    librdkafka: str = field(default="", metadata={"pairs": True, "doc": "other librdkafka properties for collectors, sink and admin: 'k=v;k2=v2' (a table in the file); no secrets"})
    librdkafka_secret: Secret = field(default_factory=_secret, metadata={"doc": "librdkafka properties holding secrets, 'k=v;k2=v2' (env or *_file only)"})
    profile: str = field(default="auto", metadata={"doc": "'tansu' (local broker quirks), 'kafka', or 'auto' (tansu when embedded)"})
    schema_registry_url: str = field(default="", metadata={"doc": "Confluent Schema Registry URL: producers frame records with its schema ids; empty = single-object encoding"})
    schema_registry_username: str = field(default="", metadata={"doc": "basic-auth user of the schema registry"})
    schema_registry_password: Secret = field(default_factory=_secret, metadata={"doc": "basic-auth password of the schema registry (env or *_file only)"})
    embedded_listen_host: str = field(default="127.0.0.1", metadata={"doc": "address the embedded broker of `perftracker up` listens on; 0.0.0.0 = every interface, for training hosts on other machines (PLAINTEXT, no authentication: a trusted network only)"})
    embedded_advertised_host: str = field(default="", metadata={"doc": "name or address the embedded broker tells clients to connect to (every client must reach it); empty = embedded_listen_host, or with 0.0.0.0 this machine's fully qualified name"})

    def client_conf(self) -> dict[str, str]:
        """librdkafka properties shared by producers, consumers and admin clients."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_mechanism == "OAUTHBEARER":
            conf.update({"sasl.oauthbearer.method": "oidc",
                         "sasl.oauthbearer.token.endpoint.url": self.sasl_oauthbearer_token_endpoint_url,
                         "sasl.oauthbearer.client.id": self.sasl_oauthbearer_client_id,
                         "sasl.oauthbearer.client.secret": self.sasl_oauthbearer_client_secret.reveal()})
            if self.sasl_oauthbearer_scope:
                conf["sasl.oauthbearer.scope"] = self.sasl_oauthbearer_scope
        elif self.sasl_mechanism:
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = self.sasl_password.reveal()
        for key, value in (("ssl.ca.location", self.ssl_ca_location),
                           ("ssl.certificate.location", self.ssl_certificate_location),
                           ("ssl.key.location", self.ssl_key_location),
                           ("ssl.key.password", self.ssl_key_password.reveal())):
            if value:
                conf[key] = value
        if not self.ssl_verify:
            conf["enable.ssl.certificate.verification"] = "false"
            conf["ssl.endpoint.identification.algorithm"] = "none"
        conf.update(parse_properties(self.librdkafka))
        conf.update(parse_properties(self.librdkafka_secret.reveal()))
        return conf


# librdkafka properties with a dedicated setting above: never taken from kafka.librdkafka*
DEDICATED_PROPERTIES = frozenset({
    "bootstrap.servers", "metadata.broker.list", "security.protocol", "sasl.mechanism", "sasl.mechanisms",
    "sasl.username", "sasl.password", "sasl.oauthbearer.method", "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "enable.ssl.certificate.verification", "ssl.endpoint.identification.algorithm"})


def parse_properties(text: str) -> dict[str, str]:
    """``'k=v;k2=v2'`` -> ``{"k": "v", "k2": "v2"}`` (blank parts skipped; checked by the loader)."""
    pairs = {}
    for part in text.split(";"):
        if part.strip():
            key, _, value = part.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True)
class StoreSettings:
    url: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "clickhouse://user@host:8123/db (clickhouses:// or ?secure=true: TLS) or chdb:///dir; empty = chDB under data_dir"})
    username: str = field(default="", metadata={"doc": "ClickHouse user; empty = the URL's, else 'default'"})
    password: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "ClickHouse password (env or *_file only); empty = the URL's"})
    ca_file: str = field(default="", metadata={"doc": "CA bundle (PEM) the ClickHouse server certificate is checked against; empty = the system's"})
    verify: bool = field(default=True, metadata={"doc": "verify the ClickHouse server certificate (TLS only; false only for tests)"})
    retention_days: int = field(default=30, metadata={"ge": 1, "doc": "TTL of raw per-window tables"})
    incident_retention_days: int = field(default=365, metadata={"ge": 1, "doc": "TTL of anomalies and incidents"})
    flush_rows: int = field(default=50_000, metadata={"ge": 1, "doc": "sink flushes when this many rows are buffered"})
    flush_interval_s: float = field(default=1.0, metadata={"gt": 0, "doc": "... or after this long"})
    max_backlog_rows: int = field(default=2_000_000, metadata={"ge": 1, "doc": "rows kept while the store is down; older ones are dropped and counted"})
    query_port: int = field(default=0, metadata={"ge": 0, "le": 65535, "doc": "port of the sink's local query API (chDB); 0 = any free port"})
    query_host: str = field(default="127.0.0.1", metadata={"doc": "address the sink's query API binds; any other than loopback needs http_token"})
    raw_ingest: bool = field(default=True, metadata={"doc": "let ClickHouse decode FunctionPattern and RankWindow (Avro + materialized views); false = decode in Python"})
    cluster: str = field(default="", metadata={"doc": "ClickHouse cluster name: migrations run ON CLUSTER with Replicated tables; empty = one server (or chDB)"})


@dataclass(frozen=True)
class StreamSettings:
    app_id: str = field(default="perftracker", metadata={"doc": "Faust app id (consumer group)"})
    window_s: float = field(default=5.0, metadata={"gt": 0, "doc": "length of a comparison window in seconds"})
    window_grace_s: float = field(default=3.0, metadata={"ge": 0, "doc": "wait this long past a window's end for late ranks"})
    fetch_wait_ms: int = field(default=200, metadata={"ge": 0, "doc": "longest a worker's Kafka fetch waits for data (Faust's own: 1500); Kafka answers at once when data comes, the embedded tansu broker only after up to half of this, per topic a record crosses; 0 = Faust's"})
    web_port: int = field(default=0, metadata={"ge": 0, "le": 65535, "doc": "Faust web port of a worker (0 = a free port, recorded in stack.json)"})
    workers: int = field(default=1, metadata={"ge": 1, "doc": "worker processes `perftracker up` starts"})
    metrics_port: int = field(default=0, metadata={"ge": 0, "le": 65535, "doc": "port of a worker's Prometheus endpoint (GET /metrics); 0 = off (`perftracker up` gives each worker a free one, recorded in stack.json)"})
    metrics_host: str = field(default="127.0.0.1", metadata={"doc": "address the worker's metrics endpoint binds"})
    web_host: str = field(default="127.0.0.1", metadata={"doc": "address a worker's Faust web server (stats) binds; any other than loopback needs http_token"})
    record_sets: bool = field(default=True, metadata={"doc": "send the FunctionPatterns of one function and the RankWindows of one job that a worker closes together for a window as one FunctionPatternSet / RankWindowSet of columns (several times cheaper to write and read); false while workers or sinks older than record sets still run (they cannot read one)"})
    gc_young_objects: int = field(default=50_000, metadata={"ge": 0, "doc": "net allocations between a worker's young garbage collections (CPython's default: 700); start-up objects are frozen; 0 = CPython's defaults (schemas/gc_policy.py)"})


@dataclass(frozen=True)
class DetectionSettings:
    mad_threshold: float = field(default=5.0, metadata={"gt": 0, "doc": "robust z (MAD units) a rank must exceed its peers by"})
    min_excess: float = field(default=0.10, metadata={"ge": 0, "doc": "relative excess over the peer median"})
    min_cost_ms_per_step: float = field(default=1.0, metadata={"ge": 0, "doc": "time a finding must cost per step"})
    persist_windows: int = field(default=2, metadata={"ge": 1, "doc": "consecutive windows before a finding is raised"})
    persist_steps: int = field(default=50, metadata={"ge": 0, "doc": "... or consecutive steps (the job's median steps of the windows it was seen in), whichever comes first; 0 = windows only"})
    clear_windows: int = field(default=2, metadata={"ge": 1, "doc": "clean windows before it is resolved"})
    regression_pct: float = field(default=5.0, metadata={"gt": 0, "doc": "recent mean step time above the recent best by this %"})
    hang_factor: float = field(default=5.0, metadata={"gt": 0, "doc": "no iteration for this many typical steps is a hang"})
    hang_floor_s: float = field(default=30.0, metadata={"gt": 0, "doc": "... and at least this many seconds"})
    peer_groups: str = field(default="", metadata={"doc": "override: 'name=0-7,16-23;other=8-15' assigns ranks to peer groups"})


@dataclass(frozen=True)
class AlertSettings:
    webhook_url: str = field(default="", metadata={"doc": "generic JSON webhook"})
    webhook_secret: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "HMAC-SHA256 key for the generic webhook"})
    slack_webhook_url: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "Slack incoming webhook URL (a secret)"})
    pagerduty_routing_key: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "PagerDuty Events v2 routing key"})
    pagerduty_url: str = field(default="https://events.pagerduty.com/v2/enqueue", metadata={"doc": "PagerDuty Events API endpoint"})
    dashboard_url: str = field(default="", metadata={"doc": "Grafana base URL linked from alerts"})
    alertmanager_urls: str = field(default="", metadata={"doc": "Alertmanager base URLs, comma-separated (http://alertmanager:9093), each sent every alert (v2 API); set, Alertmanager pages and the sink's own Slack and PagerDuty channels are off"})
    alertmanager_username: str = field(default="", metadata={"doc": "Alertmanager basic-auth user (with alertmanager_password)"})
    alertmanager_password: Secret = field(default_factory=_secret, metadata={"doc": "Alertmanager basic-auth password (env or *_file only)"})
    alertmanager_bearer_token: Secret = field(default_factory=_secret, metadata={"doc": "Alertmanager bearer token, instead of basic auth (env or *_file only)"})
    alertmanager_resend_s: float = field(default=60.0, metadata={"gt": 0, "doc": "an open incident is posted to Alertmanager again this often, its endsAt 4 times this ahead (as Prometheus does)"})
    min_impact_ms_per_step: float = field(default=0.0, metadata={"ge": 0, "doc": "do not page below this cost"})
    update_interval_s: float = field(default=300.0, metadata={"ge": 0, "doc": "at most one 'update' notification per incident per channel this often"})
    timeout_s: float = field(default=5.0, metadata={"gt": 0, "doc": "HTTP timeout of one alert delivery attempt"})
    max_attempts: int = field(default=12, metadata={"ge": 1, "doc": "delivery attempts per notification (exponential backoff with jitter between): 12 ride out a receiver down for 90 s at least"})
    retry_base_s: float = field(default=0.5, metadata={"gt": 0, "doc": "first retry delay; doubles per attempt, capped at 30 s"})
    queue_size: int = field(default=1000, metadata={"ge": 1, "doc": "notifications queued per channel; beyond, new ones are dropped and counted"})
    workers_per_channel: int = field(default=4, metadata={"ge": 1, "doc": "parallel deliveries per channel (one hung incident never stalls the others)"})


@dataclass(frozen=True)
class RemediationSettings:
    """Acting on a confirmed host fault: drain the culprit node (docs/operations.md, "Remediation")."""

    enabled: bool = field(default=False, metadata={"doc": "drain (SLURM) or cordon (Kubernetes, dry-run only) the node of a confirmed hardware incident; off by default"})
    mode: str = field(default="slurm", metadata={"doc": "'slurm' (scontrol update State=DRAIN) or 'kubernetes' (kubectl cordon and its Node patch, recorded, never run)"})
    dry_run: bool = field(default=True, metadata={"doc": "decide, record and log what would be done, run nothing (rate limits apply as if it ran)"})
    causes: str = field(default="slow_gpu,gpu_throttle", metadata={"doc": "causes acted on, comma-separated (schemas/causes.py ids); default: the GPU hardware ones"})
    confirm_s: float = field(default=300.0, metadata={"ge": 0, "doc": "an incident is acted on once it stayed open (not resolved) this long"})
    max_age_s: float = field(default=600.0, metadata={"gt": 0, "doc": "an incident whose newest data is older than this when it opens here (a replay) is left alone"})
    max_per_hour: int = field(default=2, metadata={"ge": 1, "doc": "nodes drained in any rolling hour, all jobs together (the store's record counts: every sink)"})
    node_cooldown_s: float = field(default=86400.0, metadata={"ge": 0, "doc": "a node is never drained twice within this long"})
    max_job_fraction: float = field(default=0.25, metadata={"gt": 0, "le": 1, "doc": "never drain more than this share of a job's hosts"})
    scontrol: str = field(default="scontrol", metadata={"doc": "scontrol program (a name on PATH or a path)"})
    timeout_s: float = field(default=10.0, metadata={"gt": 0, "doc": "longest one scontrol call may take"})


@dataclass(frozen=True)
class CollectorSettings:
    """Read by ``attach()`` in each training process, from the environment only."""

    enabled: bool = field(default=True, metadata={"doc": "master switch; false = attach() does nothing"})
    job: str = field(default="", metadata={"doc": "job id; empty = the launcher's run id (torchrun rdzv id, SLURM_JOB_ID, JobSet/PyTorchJob name), else rank 0's id agreed through the job's c10d store"})
    job_agreement_s: float = field(default=120.0, metadata={"ge": 0, "doc": "longest wait for the job's process group to agree on a job id; batches are held meanwhile"})
    bootstrap_servers: str = field(default="", metadata={"doc": "Kafka bootstrap; empty = kafka.bootstrap_servers"})
    host: str = field(default="", metadata={"doc": "machine name reported for this rank; empty = the hostname (in Kubernetes set it to the node name: the pod name is not the machine)"})
    buffer_mb: float = field(default=32.0, metadata={"gt": 0, "doc": "bound of the in-process event buffer; oldest dropped when full"})
    relay_socket: str = field(default="", metadata={"doc": "the host's relay (`perftracker relay`, `launch --relay`): "
                                                           "send through its Unix socket at this path, one Kafka "
                                                           "message per host and flush; Kafka directly when it does "
                                                           "not take a message; empty = Kafka directly"})
    flush_interval_s: float = field(default=1.0, metadata={"gt": 0, "doc": "a batch is built and sent this often"})
    exit_flush_s: float = field(default=2.0, metadata={"ge": 0, "doc": "longest wait for delivery at process exit"})
    max_batch_events: int = field(default=10_000, metadata={"ge": 1, "doc": "events per Kafka message at most (v8's "
                                                                        "fixed-width columns: <= 48 bytes an event, "
                                                                        "~0.5 MB, under Kafka's 1 MB per message)"})
    event_batch_version: int = field(default=9, metadata={"ge": 7, "le": 9, "doc": "EventBatch version written: 9 "
                                                                          "(process groups' members as ranges) once "
                                                                          "every stream worker reads it, 8 (packed "
                                                                          "columns) or 7 while some do not"})
    batch_min_events: int = field(default=0, metadata={"ge": 0, "doc": "a send cycle with fewer events than this "
                                                                   "keeps them for a larger message, at most "
                                                                   "batch_max_delay_s (0 = send every cycle)"})
    batch_max_delay_s: float = field(default=1.0, metadata={"gt": 0, "le": 5.0, "doc": "longest an event waits for a "
                                                                               "larger message (at most the 5 s heartbeat)"})
    batch_window_s: float = field(default=0.0, metadata={"ge": 0, "le": 5.0, "doc": "send only the first cycle past each "
                                                                              "multiple of this (+ the 0.5 s close lag), "
                                                                              "the one that closes a comparison window: one "
                                                                              "batch per window, no later (the workers' "
                                                                              "window_s or a divisor; 0 = every cycle)"})
    functions: str = field(default="", metadata={"doc": "extra functions to time, 'module:qualname' comma-separated"})
    comms: bool = field(default=True, metadata={"doc": "time torch.distributed collectives and p2p calls"})
    ddp_hook: bool = field(default=True, metadata={"doc": "register a timed all-reduce comm hook in DDP models"})
    functional: bool = field(default=True, metadata={
        "doc": "time functional collectives (DTensor, tensor parallel, compiled graphs; ~3 us each)"})
    functional_sample: int = field(default=1, metadata={"ge": 1, "doc": "record one functional collective in n "
                                                                       "of each group (seq a multiple of n, the same "
                                                                       "on every rank); the rest only numbered"})
    functional_steps: int = field(default=1, metadata={"ge": 1, "doc": "record functional collectives during one "
                                                                      "step in n only (step a multiple of n, the same "
                                                                      "on every rank); the hooks are out on the others"})
    forward: bool = field(default=True, metadata={"doc": "time the root module's forward"})
    gc: bool = field(default=True, metadata={"doc": "time garbage-collector pauses"})
    gc_min_us: float = field(default=50.0, metadata={"ge": 0, "doc": "GC pauses shorter than this are counted in stats, not sent"})
    stats_file: str = field(default="", metadata={"doc": "write the collector's stats as JSON here at exit ({rank}, {pid} expand)"})
    iteration_repeats: int = field(default=10, metadata={"ge": 1, "doc": "identical repeats before an iteration pattern is locked"})
    iteration_relearn: int = field(default=200, metadata={"ge": 1, "doc": "non-matching events before the pattern is re-learned"})
    control: bool = field(default=False, metadata={"doc": "follow pt.control profiling requests (off by default: "
                                                          "the live diagnosis does not read the windows' summaries)"})
    profile_every_s: float = field(default=0.0, metadata={"ge": 0, "doc": "duty-cycle profiling window period; 0 = only on "
                                                                 "request (the default: see control)"})
    profile_duration_s: float = field(default=2.0, metadata={"gt": 0, "doc": "length of a duty-cycle profiling window"})
    profile_max_steps: int = field(default=10, metadata={"ge": 0, "doc": "a profiling window (duty-cycle or requested) ends after "
                                                                "this many iterations at most: stopping torch.profiler "
                                                                "costs the training thread time in proportion to the ops "
                                                                "recorded (0 = no limit)"})
    nvml_interval_s: float = field(default=1.0, metadata={"ge": 0, "doc": "NVML sampling period; 0 = off"})
    nvml_profile_interval_s: float = field(default=0.1, metadata={"gt": 0, "doc": "NVML sampling period inside a profiling window"})
    log_every_s: float = field(default=60.0, metadata={"ge": 0, "doc": "an instrumentation error is logged at most this often"})
    metrics_port: int = field(default=0, metadata={"ge": 0, "le": 65535, "doc": "opt-in Prometheus endpoint of each training process at this port + LOCAL_RANK (needs prometheus-client); 0 = off"})
    metrics_host: str = field(default="127.0.0.1", metadata={"doc": "address the collector's metrics endpoint binds"})
    cpu_evidence: bool = field(default=True, metadata={"doc": "read the training thread's CPU, run-queue wait, context switches and faults from /proc"})
    stack_hz: float = field(default=25.0, metadata={"ge": 0, "doc": "samples per second of the training thread's Python stack; 0 = off"})
    user_code_paths: str = field(default="", metadata={
        "doc": "path fragments, comma-separated, whose files the stack sampler counts as the job's own code even "
               "inside site-packages or perftracker (e.g. a training package installed as a library)"})

    @property
    def buffer_events(self) -> int:
        return max(1024, int(self.buffer_mb * 1024 * 1024) // EVENT_COST_BYTES)


EVENT_COST_BYTES = 256  # measured size of one buffered event tuple with its ints


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default=Path(".perftracker"), metadata={"doc": "state, logs and chDB data of the embedded stack"})
    log_level: str = field(default="INFO", metadata={"doc": "DEBUG, INFO, WARNING, ERROR"})
    log_format: str = field(default="text", metadata={"doc": "text (one line per record) or json (one JSON object per line)"})
    log_file: str = field(default="", metadata={"doc": "log file of a worker or sink; empty = <data_dir>/logs/<worker|sink>.log, '-' = standard error only"})
    http_token: Secret = field(default_factory=lambda: Secret(""), metadata={"doc": "bearer token of every HTTP endpoint (query API, worker web, metrics); required to bind one beyond loopback (env or *_file only)"})
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    streams: StreamSettings = field(default_factory=StreamSettings)
    detection: DetectionSettings = field(default_factory=DetectionSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    collector: CollectorSettings = field(default_factory=CollectorSettings, metadata={
        "env_only": "collector settings are read in each training process from PERFTRACKER_COLLECTOR_* "
                    "(`perftracker launch` passes its environment on), not from the config file"})
