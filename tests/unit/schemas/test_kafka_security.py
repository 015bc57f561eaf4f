"""Kafka security settings -> librdkafka configuration, for every mode, and the load-time checks.

librdkafka itself checks each configuration: a producer is built from it (property
names, values, the CA, the client certificate and the encrypted key with its
password are all loaded at construction), and a mutual-TLS handshake is completed
against a local TLS listener. No broker with TLS or SASL runs here (tansu is
plaintext only), so SASL is checked up to the configuration librdkafka accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import KafkaSettings, Secret
from perftracker_ml.schemas.settings_loader import load_settings, section_env

from ...tls import KEY_PASSWORD, TLSFiles, TLSListener, make_tls_files

SASL_PW, OIDC_SECRET, EXTRA_SECRET = "sasl-pw-1", "oidc-secret-2", "keystore-pw-3"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def load(env: dict[str, str], toml: str = "", tmp_path: Path | None = None) -> KafkaSettings:
    path = None
    if toml:
        assert tmp_path is not None
        path = tmp_path / "pt.toml"
        path.write_text(toml)
    return load_settings(path, env={"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": "localhost:1", **env}).kafka


def build(conf: dict[str, str]) -> Producer:
    """librdkafka's own check of a configuration (raises KafkaException when it refuses it)."""
    return Producer({**conf, "log_level": 0})


def test_plaintext_is_the_default():
    conf = load({}).client_conf()
    assert conf == {"bootstrap.servers": "localhost:1", "security.protocol": "PLAINTEXT"}
    build(conf)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_user_and_password(mechanism, protocol):
    conf = load({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": protocol, "PERFTRACKER_KAFKA_SASL_MECHANISM": mechanism,
                 "PERFTRACKER_KAFKA_SASL_USERNAME": "svc", "PERFTRACKER_KAFKA_SASL_PASSWORD": SASL_PW}).client_conf()
    assert conf["security.protocol"] == protocol and conf["sasl.mechanism"] == mechanism
    assert conf["sasl.username"] == "svc" and conf["sasl.password"] == SASL_PW
    build(conf)


def test_oauthbearer_oidc_client_credentials(tmp_path):
    secret_file = tmp_path / "client-secret"
    secret_file.write_text(OIDC_SECRET + "\n")
    kafka = load({"PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": str(secret_file)},
                 '[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "OAUTHBEARER"\n'
                 'sasl_oauthbearer_token_endpoint_url = "https://idp.example/oauth2/token"\n'
                 'sasl_oauthbearer_client_id = "perftracker"\nsasl_oauthbearer_scope = "kafka"\n', tmp_path)
    conf = kafka.client_conf()
    assert conf["sasl.mechanism"] == "OAUTHBEARER" and conf["sasl.oauthbearer.method"] == "oidc"
    assert conf["sasl.oauthbearer.token.endpoint.url"] == "https://idp.example/oauth2/token"
    assert conf["sasl.oauthbearer.client.id"] == "perftracker"
    assert conf["sasl.oauthbearer.client.secret"] == OIDC_SECRET
    assert conf["sasl.oauthbearer.scope"] == "kafka"
    assert "sasl.username" not in conf and "sasl.password" not in conf
    build(conf)


def tls_env(tls: TLSFiles, password: str = KEY_PASSWORD, ca: Path | None = None) -> dict[str, str]:
    return {"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SSL", "PERFTRACKER_KAFKA_SSL_CA_LOCATION": str(ca or tls.ca),
            "PERFTRACKER_KAFKA_SSL_CERTIFICATE_LOCATION": str(tls.client_cert),
            "PERFTRACKER_KAFKA_SSL_KEY_LOCATION": str(tls.client_key),
            "PERFTRACKER_KAFKA_SSL_KEY_PASSWORD": password}


def test_tls_ca_client_certificate_and_encrypted_key(tls):
    conf = load(tls_env(tls)).client_conf()
    assert conf["ssl.ca.location"] == str(tls.ca) and conf["ssl.certificate.location"] == str(tls.client_cert)
    assert conf["ssl.key.location"] == str(tls.client_key) and conf["ssl.key.password"] == KEY_PASSWORD
    assert "enable.ssl.certificate.verification" not in conf  # verification stays on
    build(conf)  # librdkafka decrypts the key with the password here
    with pytest.raises(KafkaException):
        build(load(tls_env(tls, password="wrong")).client_conf())


def test_tls_mutual_handshake_with_librdkafka(tls):
    listener = TLSListener(tls)
    try:
        kafka = load({**tls_env(tls), "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": listener.bootstrap})
        producer = build(kafka.client_conf())  # connects to the bootstrap server at once
        assert listener.handshake.wait(10), listener.errors
        producer.flush(0)
        assert "perftracker-client" in listener.peers
    finally:
        listener.close()


def test_tls_without_verification(tls):
    conf = load({**tls_env(tls, ca=tls.other_ca), "PERFTRACKER_KAFKA_SSL_VERIFY": "false"}).client_conf()
    assert conf["enable.ssl.certificate.verification"] == "false"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    build(conf)


def test_sasl_ssl_combines_both(tls):
    env = {**tls_env(tls), "PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PERFTRACKER_KAFKA_SASL_MECHANISM":
           "SCRAM-SHA-512", "PERFTRACKER_KAFKA_SASL_USERNAME": "svc", "PERFTRACKER_KAFKA_SASL_PASSWORD": SASL_PW}
    conf = load(env).client_conf()
    assert conf["sasl.password"] == SASL_PW and conf["ssl.key.password"] == KEY_PASSWORD
    build(conf)


def test_librdkafka_pass_through_from_table_env_and_secret(tmp_path):
    kafka = load({"PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET": f"ssl.keystore.password={EXTRA_SECRET}"},
                 '[kafka]\nlibrdkafka = { "socket.keepalive.enable" = true, "client.id" = "pt-sink", '
                 '"reconnect.backoff.max.ms" = 2000 }\n', tmp_path)
    conf = kafka.client_conf()
    assert conf["socket.keepalive.enable"] == "true" and conf["client.id"] == "pt-sink"
    assert conf["reconnect.backoff.max.ms"] == "2000" and conf["ssl.keystore.password"] == EXTRA_SECRET
    assert EXTRA_SECRET not in repr(kafka)
    env_kafka = load({"PERFTRACKER_KAFKA_LIBRDKAFKA": "client.id=a; acks=all ;"})
    assert env_kafka.client_conf()["client.id"] == "a" and env_kafka.client_conf()["acks"] == "all"
    build({k: v for k, v in conf.items() if k != "ssl.keystore.password"})


@pytest.mark.parametrize("extra, fragment", [
    ("error_cb=x", "not a librdkafka property name"),
    ("Client.Id=x", "not a librdkafka property name"),
    ("a..b=1", "not a librdkafka property name"),
    ("bootstrap.servers=evil:9092", "has its own setting .kafka.bootstrap_servers"),
    ("sasl.password=pw", "has its own setting .kafka.sasl_password"),
    ("enable.ssl.certificate.verification=false", "has its own setting .kafka.ssl_verify"),
    ("ssl.keystore.password=pw", "looks like a secret"),
    ("sasl.oauthbearer.config=principal=x", "looks like a secret"),
    ("ssl.key.pem=-----BEGIN", "looks like a secret"),
])
def test_librdkafka_pass_through_refuses(extra, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        load({"PERFTRACKER_KAFKA_LIBRDKAFKA": extra})
    assert "pw" not in str(err.value).replace("password", "")


def test_secret_pass_through_still_checks_names(tmp_path):
    with pytest.raises(ConfigError, match="has its own setting"):
        load({"PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET": "sasl.password=x"})
    with pytest.raises(ConfigError, match="is a secret"):
        load({}, '[kafka]\nlibrdkafka_secret = "ssl.keystore.password=x"\n', tmp_path)


@pytest.mark.parametrize("env, fragment", [
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "TLS"}, "not one of PLAINTEXT"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs kafka.sasl_mechanism"),
    ({"PERFTRACKER_KAFKA_SASL_MECHANISM": "PLAIN"}, "needs kafka.security_protocol SASL_SSL"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PERFTRACKER_KAFKA_SASL_MECHANISM": "GSSAPI"},
     "one of PLAIN, SCRAM-SHA-256"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PERFTRACKER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
      "PERFTRACKER_KAFKA_SASL_USERNAME": "u"}, "needs kafka.sasl_username and the secret"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PERFTRACKER_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
      "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "c", "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "s"},
     "needs kafka.sasl_oauthbearer_token_endpoint_url"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PERFTRACKER_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
      "PERFTRACKER_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "https://idp/t"},
     "needs kafka.sasl_oauthbearer_client_id and the secret"),
    ({"PERFTRACKER_KAFKA_SSL_CA_LOCATION": "/etc/hostname"}, "use SSL or SASL_SSL"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SSL", "PERFTRACKER_KAFKA_SSL_CA_LOCATION": "/no/such/ca.pem"},
     "no such file /no/such/ca.pem"),
    ({"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SSL", "PERFTRACKER_KAFKA_SSL_KEY_LOCATION": "/etc/hostname"},
     "needs both kafka.ssl_certificate_location"),
    ({"PERFTRACKER_KAFKA_SCHEMA_REGISTRY_URL": "https://u:regpw@registry:8081"}, "holds a password"),
])
def test_settings_that_cannot_work_are_refused_by_name(env, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        load(env)
    for secret in ("regpw", "kp"):
        assert secret not in str(err.value)


def test_collectors_check_the_same_rules():
    from perftracker_ml.collectors.config import load_attach_settings

    with pytest.raises(ConfigError, match="needs kafka.sasl_mechanism"):
        load_attach_settings(env={"PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})


def test_launch_hands_every_kafka_setting_to_the_training_processes(tls, tmp_path):
    """`perftracker launch` passes the Kafka settings on in the environment: the children rebuild them."""
    from perftracker_ml.collectors.config import load_attach_settings

    env = {**tls_env(tls), "PERFTRACKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "PERFTRACKER_KAFKA_SASL_MECHANISM": "PLAIN", "PERFTRACKER_KAFKA_SASL_USERNAME": "svc",
           "PERFTRACKER_KAFKA_SASL_PASSWORD": SASL_PW, "PERFTRACKER_KAFKA_SSL_VERIFY": "false",
           "PERFTRACKER_KAFKA_LIBRDKAFKA": "client.id=trainer", "PERFTRACKER_KAFKA_LIBRDKAFKA_SECRET":
           f"ssl.keystore.password={EXTRA_SECRET}"}
    kafka = load(env)
    child = load_attach_settings(env=section_env(kafka, "kafka")).kafka
    assert child == kafka and child.client_conf() == kafka.client_conf()
    assert section_env(KafkaSettings(), "kafka") == {}
    assert section_env(KafkaSettings(sasl_password=Secret("x")), "kafka") == {"PERFTRACKER_KAFKA_SASL_PASSWORD": "x"}
