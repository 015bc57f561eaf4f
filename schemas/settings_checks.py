"""Settings that load but cannot work together, refused at load time with what to change.

Kafka security (:func:`check_kafka`): the protocol and SASL mechanism are known
ones and agree, each mechanism has its credentials, TLS files exist, and the
``kafka.librdkafka`` pass-through holds well-formed librdkafka property names,
none with a dedicated setting and none secret-looking (those go to
``kafka.librdkafka_secret``, from the environment or a file only). Error
messages name settings, never a secret's value.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError
from .redact import redact_url_passwords, remember_secret
from .settings import (
    DEDICATED_PROPERTIES,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaSettings,
    Settings,
    parse_properties,
)

# a librdkafka property: dotted lower-case words ("socket.keepalive.enable", "acks"); the Python
# client's callbacks ("error_cb", "logger") and anything else are refused
_PROPERTY = re.compile(r"[a-z][a-z0-9]*(\.[a-z0-9_]+)*")
_SECRET_LOOKING = re.compile(r"password|secret|token|credential|jaas|\.pem$|oauthbearer\.config")


def check_settings(settings: Settings) -> None:
    """Every cross-field rule of the loaded settings (raises :class:`ConfigError`)."""
    check_kafka(settings.kafka)
    check_urls(settings)


def check_urls(settings: Settings) -> None:
    """Every http(s) URL setting, when set, is one: a scheme, a host, a numeric port (the store
    URL is checked where it is parsed, ``perftracker_ml.sinks.store``). A secret's value is never
    shown; the others are, their password part masked."""
    alerts = settings.alerts
    for name, value, example in (
            ("kafka.schema_registry_url", settings.kafka.schema_registry_url, "http://registry.example:8081"),
            ("alerts.webhook_url", alerts.webhook_url, "https://hooks.example.com/perftracker"),
            ("alerts.slack_webhook_url", alerts.slack_webhook_url.reveal(), "https://hooks.slack.com/services/..."),
            ("alerts.pagerduty_url", alerts.pagerduty_url, "https://events.pagerduty.com/v2/enqueue"),
            ("alerts.dashboard_url", alerts.dashboard_url, "https://grafana.example.com")):
        problem = http_url_problem(value) if value else None
        if problem:
            shown = "" if name == "alerts.slack_webhook_url" else f" {redact_url_passwords(value)!r}"
            raise ConfigError(f"{name}{shown} is not a usable URL: {problem}; expected e.g. {example}")
    for url in (u.strip() for u in alerts.alertmanager_urls.split(",")):
        problem = http_url_problem(url) if url else None
        if problem:
            raise ConfigError(f"alerts.alertmanager_urls {redact_url_passwords(url)!r} is not a usable URL: "
                              f"{problem}; expected e.g. http://alertmanager:9093 (comma-separated)")
    if alerts.alertmanager_bearer_token and (alerts.alertmanager_username or alerts.alertmanager_password):
        raise ConfigError("alerts.alertmanager_bearer_token and alerts.alertmanager_username/password "
                          "are both set: Alertmanager takes one, a bearer token or basic auth")


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an absolute http(s) URL with a host, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return "the port must be a number (an IPv6 host in [...])"
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    if not parts.hostname:
        return "it has no host"
    return None


def check_kafka(kafka: KafkaSettings) -> None:
    """The Kafka client settings can build a working client configuration."""
    protocol = kafka.security_protocol
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"kafka.security_protocol {protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}")
    _check_sasl(kafka)
    if _has_password(kafka.schema_registry_url):
        raise ConfigError("kafka.schema_registry_url holds a password: set the user in "
                          "kafka.schema_registry_username and the password in "
                          "PERFTRACKER_KAFKA_SCHEMA_REGISTRY_PASSWORD (or *_FILE)")
    _check_tls(kafka)
    _check_properties(kafka.librdkafka, "kafka.librdkafka", secret=False)
    _check_properties(kafka.librdkafka_secret.reveal(), "kafka.librdkafka_secret", secret=True)


def _has_password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False


def _check_sasl(kafka: KafkaSettings) -> None:
    sasl = kafka.security_protocol.startswith("SASL_")
    mechanism = kafka.sasl_mechanism
    if not sasl:
        if mechanism:
            raise ConfigError(f"kafka.sasl_mechanism {mechanism} needs kafka.security_protocol "
                              f"SASL_SSL or SASL_PLAINTEXT (it is {kafka.security_protocol})")
        return
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"kafka.security_protocol {kafka.security_protocol} needs kafka.sasl_mechanism, "
                          f"one of {', '.join(SASL_MECHANISMS)} (got {mechanism or 'none'})")
    if mechanism == "OAUTHBEARER":
        url = kafka.sasl_oauthbearer_token_endpoint_url
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError("OAUTHBEARER needs kafka.sasl_oauthbearer_token_endpoint_url, an http(s) URL "
                              "of the OIDC provider's token endpoint")
        if not kafka.sasl_oauthbearer_client_id or not kafka.sasl_oauthbearer_client_secret:
            raise ConfigError("OAUTHBEARER needs kafka.sasl_oauthbearer_client_id and the secret "
                              "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET (or *_FILE)")
    elif not kafka.sasl_username or not kafka.sasl_password:
        raise ConfigError(f"SASL {mechanism} needs kafka.sasl_username and the secret "
                          "PERFTRACKER_KAFKA_SASL_PASSWORD (or *_FILE)")


def _check_tls(kafka: KafkaSettings) -> None:
    files = {"ssl_ca_location": kafka.ssl_ca_location, "ssl_certificate_location": kafka.ssl_certificate_location,
             "ssl_key_location": kafka.ssl_key_location}
    given = [name for name, path in files.items() if path]
    if given and not kafka.security_protocol.endswith("SSL"):
        raise ConfigError(f"kafka.{given[0]} is set but kafka.security_protocol is {kafka.security_protocol}; "
                          "use SSL or SASL_SSL")
    if bool(kafka.ssl_certificate_location) != bool(kafka.ssl_key_location):
        raise ConfigError("TLS client authentication needs both kafka.ssl_certificate_location and "
                          "kafka.ssl_key_location")
    for name in given:
        if not Path(files[name]).expanduser().is_file():
            raise ConfigError(f"kafka.{name}: no such file {files[name]}")


def _check_properties(text: str, where: str, secret: bool) -> None:
    for key, value in parse_properties(text).items():
        if not _PROPERTY.fullmatch(key):
            raise ConfigError(f"{where}: {key[:40]!r} is not a librdkafka property name (dotted lower-case words, "
                              "e.g. socket.keepalive.enable=true)")
        if key in DEDICATED_PROPERTIES:
            raise ConfigError(f"{where}: {key} has its own setting (kafka.{_setting_of(key)}); set that instead")
        if secret:
            remember_secret(value)  # each value is masked on its own
        elif _SECRET_LOOKING.search(key):
            raise ConfigError(f"{where}: {key} looks like a secret; put it in PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET "
                              "or kafka.librdkafka_secret_file instead (never in the config file)")


def _setting_of(prop: str) -> str:
    special = {"metadata.broker.list": "bootstrap_servers", "sasl.mechanisms": "sasl_mechanism",
               "sasl.oauthbearer.method": "sasl_mechanism = OAUTHBEARER",
               "enable.ssl.certificate.verification": "ssl_verify",
               "ssl.endpoint.identification.algorithm": "ssl_verify"}
    return special.get(prop, prop.replace(".", "_"))
