"""The worker's Kafka security: settings -> Faust credentials -> aiokafka's client arguments.

Faust turns ``broker_credentials`` into aiokafka keyword arguments
(``credentials_to_aiokafka_auth``); these tests check those arguments for every mode,
complete a mutual-TLS handshake with aiokafka's own client, and run the OIDC token
provider against a local token endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from perftracker_ml.schemas.settings import KafkaSettings, Secret
from perftracker_ml.streams import kafka_auth
from perftracker_ml.streams.kafka_auth import (
    OIDCTokenProvider,
    TokenError,
    broker_credentials,
    ignored_properties,
)

from ...tls import KEY_PASSWORD, TLSFiles, TLSListener, make_tls_files

CLIENT_ID, CLIENT_SECRET = "perftracker", "oidc-s3cret-9"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def tls_settings(tls: TLSFiles, **kw) -> KafkaSettings:
    base = {"security_protocol": "SSL", "ssl_ca_location": str(tls.ca),
            "ssl_certificate_location": str(tls.client_cert), "ssl_key_location": str(tls.client_key),
            "ssl_key_password": Secret(KEY_PASSWORD)}
    return KafkaSettings(**{**base, **kw})


def aiokafka_auth(kafka: KafkaSettings) -> dict:
    return credentials_to_aiokafka_auth(broker_credentials(kafka), None)


def test_plaintext_has_no_credentials():
    assert broker_credentials(KafkaSettings()) is None
    assert aiokafka_auth(KafkaSettings()) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext(mechanism):
    kafka = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="svc",
                          sasl_password=Secret("pw-1"))
    auth = aiokafka_auth(kafka)
    assert auth == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                    "sasl_plain_username": "svc", "sasl_plain_password": "pw-1", "ssl_context": None}
    assert "pw-1" not in repr(broker_credentials(kafka))


def test_sasl_ssl_carries_the_tls_context(tls):
    kafka = tls_settings(tls, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="svc",
                         sasl_password=Secret("pw-2"))
    auth = aiokafka_auth(kafka)
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert isinstance(auth["ssl_context"], ssl.SSLContext)
    assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED and auth["ssl_context"].check_hostname


def test_ssl_context_loads_the_encrypted_key_with_its_password(tls):
    auth = aiokafka_auth(tls_settings(tls))
    assert auth["security_protocol"] == "SSL" and isinstance(auth["ssl_context"], ssl.SSLContext)
    with pytest.raises(ssl.SSLError):
        broker_credentials(tls_settings(tls, ssl_key_password=Secret("wrong")))


def test_ssl_without_verification(tls):
    context = aiokafka_auth(tls_settings(tls, ssl_verify=False))["ssl_context"]
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname


def test_mutual_tls_handshake_with_aiokafka(tls):
    from aiokafka.client import AIOKafkaClient

    listener = TLSListener(tls)

    async def connect() -> None:
        client = AIOKafkaClient(bootstrap_servers=listener.bootstrap, request_timeout_ms=3000,
                                **aiokafka_auth(tls_settings(tls)))
        try:
            await client.bootstrap()  # the listener speaks TLS, not Kafka
        except Exception:  # noqa: BLE001 - any Kafka-level failure after the handshake
            pass
        finally:
            await client.close()

    try:
        asyncio.run(connect())
        assert listener.handshake.wait(5), listener.errors
        assert "perftracker-client" in listener.peers
    finally:
        listener.close()


def test_oauthbearer_uses_the_oidc_token_provider(tls):
    kafka = tls_settings(tls, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                         sasl_oauthbearer_token_endpoint_url="https://idp.example/token",
                         sasl_oauthbearer_client_id=CLIENT_ID, sasl_oauthbearer_client_secret=Secret(CLIENT_SECRET))
    creds = broker_credentials(kafka)
    assert isinstance(creds, faust.OAuthCredentials)
    auth = credentials_to_aiokafka_auth(creds, None)
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(auth["sasl_oauth_token_provider"], OIDCTokenProvider)
    assert CLIENT_SECRET not in repr(auth)


def test_librdkafka_properties_the_worker_cannot_apply_are_named():
    kafka = KafkaSettings(librdkafka="client.id=a;acks=all", librdkafka_secret=Secret("ssl.keystore.password=x"))
    assert ignored_properties(kafka) == ["acks", "client.id", "ssl.keystore.password"]
    assert ignored_properties(KafkaSettings()) == []


class TokenEndpoint(BaseHTTPRequestHandler):
    requests: list[dict] = []
    status = 200
    lifetime = 3600

    def log_message(self, *args):
        pass

    def do_POST(self):
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        auth = self.headers.get("Authorization", "")
        type(self).requests.append({"form": form, "auth": auth, "type": self.headers.get("Content-Type")})
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        code = self.status if auth == expected else 401
        body = {"access_token": f"token-{len(self.requests)}", "token_type": "Bearer",
                "expires_in": self.lifetime} if code == 200 else {"error": "invalid_client"}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def token_url():
    TokenEndpoint.requests, TokenEndpoint.status, TokenEndpoint.lifetime = [], 200, 3600
    server = ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/oauth2/token"
    server.shutdown()
    server.server_close()


def test_oidc_client_credentials_grant_is_cached(token_url):
    provider = OIDCTokenProvider(token_url, CLIENT_ID, CLIENT_SECRET, scope="kafka.produce kafka.consume")
    assert asyncio.run(provider.token()) == "token-1"
    assert asyncio.run(provider.token()) == "token-1"  # cached
    [req] = TokenEndpoint.requests
    assert req["form"] == {"grant_type": ["client_credentials"], "scope": ["kafka.produce kafka.consume"]}
    assert req["type"] == "application/x-www-form-urlencoded"


def test_oidc_token_is_renewed_before_it_expires(token_url, monkeypatch):
    TokenEndpoint.lifetime = 100
    provider = OIDCTokenProvider(token_url, CLIENT_ID, CLIENT_SECRET)
    now = [1000.0]
    monkeypatch.setattr(kafka_auth.time, "monotonic", lambda: now[0])
    assert provider.token_now() == "token-1"
    now[0] += 100 * kafka_auth.REFRESH_FRACTION - 1
    assert provider.token_now() == "token-1"
    now[0] += 2
    assert provider.token_now() == "token-2"
    assert "scope" not in TokenEndpoint.requests[0]["form"]


def test_oidc_errors_name_the_endpoint_never_the_secret(token_url):
    with pytest.raises(TokenError, match="refused the client credentials: HTTP 401") as err:
        OIDCTokenProvider(token_url, CLIENT_ID, "wrong-" + CLIENT_SECRET).token_now()
    assert CLIENT_SECRET not in str(err.value)
    with pytest.raises(TokenError, match="unreachable") as err:
        OIDCTokenProvider("http://127.0.0.1:9/token", CLIENT_ID, CLIENT_SECRET, timeout_s=2).token_now()
    assert CLIENT_SECRET not in str(err.value)
