"""The worker's Kafka security: :class:`~..schemas.settings.KafkaSettings` as Faust credentials.

The counterpart of ``KafkaSettings.client_conf()`` (librdkafka, for collectors and
sink) for Faust's aiokafka clients: the same settings give TLS (CA, client
certificate and key with its password, verification), SASL PLAIN and
SCRAM-SHA-256/512, and OAUTHBEARER with an OIDC client-credentials token
(:class:`OIDCTokenProvider`, the grant librdkafka's ``sasl.oauthbearer.method=oidc``
performs). ``kafka.librdkafka`` properties are librdkafka's: aiokafka has no
equivalent, so a worker logs which ones it does not apply.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import faust
from aiokafka.abc import AbstractTokenProvider

from ..schemas.errors import PerftrackerError
from ..schemas.settings import KafkaSettings, parse_properties

log = logging.getLogger(__name__)

REFRESH_FRACTION = 0.8  # a token is renewed after this share of its lifetime
DEFAULT_LIFETIME_S = 300.0  # when the provider does not say (expires_in)


class TokenError(PerftrackerError):
    """The OIDC token endpoint refused or could not be reached (never shows the secret)."""


def broker_credentials(kafka: KafkaSettings) -> Any:
    """Faust ``broker_credentials`` for these settings; None for PLAINTEXT."""
    protocol = kafka.security_protocol
    context = ssl_context(kafka) if protocol.endswith("SSL") else None
    if kafka.sasl_mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=OIDCTokenProvider.from_settings(kafka), ssl_context=context)
    if kafka.sasl_mechanism:
        return faust.SASLCredentials(username=kafka.sasl_username, password=kafka.sasl_password.reveal(),
                                     mechanism=kafka.sasl_mechanism, ssl_context=context)
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: CA (else the system's), client certificate and key, verification."""
    context = ssl.create_default_context(cafile=kafka.ssl_ca_location or None)
    if kafka.ssl_certificate_location:
        context.load_cert_chain(kafka.ssl_certificate_location, kafka.ssl_key_location or None,
                                password=kafka.ssl_key_password.reveal() or None)
    if not kafka.ssl_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def ignored_properties(kafka: KafkaSettings) -> list[str]:
    """The ``kafka.librdkafka*`` property names a worker cannot apply (aiokafka is not librdkafka)."""
    return sorted({*parse_properties(kafka.librdkafka), *parse_properties(kafka.librdkafka_secret.reveal())})


class OIDCTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """OAuth 2.0 client-credentials grant against an OIDC token endpoint, cached until
    :data:`REFRESH_FRACTION` of the token's lifetime has passed.

    The request is the one librdkafka sends: ``POST`` ``grant_type=client_credentials``
    (and ``scope``) with the client id and secret as HTTP basic auth."""

    def __init__(self, url: str, client_id: str, client_secret: str, scope: str = "", timeout_s: float = 10.0):
        self.url, self.scope, self.timeout_s = url, scope, timeout_s
        self._auth = "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
        self._token = ""
        self._renew_at = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, kafka: KafkaSettings) -> OIDCTokenProvider:
        return cls(kafka.sasl_oauthbearer_token_endpoint_url, kafka.sasl_oauthbearer_client_id,
                   kafka.sasl_oauthbearer_client_secret.reveal(), kafka.sasl_oauthbearer_scope)

    def __repr__(self) -> str:
        return f"OIDCTokenProvider({self.url!r})"

    async def token(self) -> str:
        return await asyncio.get_running_loop().run_in_executor(None, self.token_now)

    def token_now(self) -> str:
        """The cached access token, fetched anew when it is due (blocking)."""
        with self._lock:
            if not self._token or time.monotonic() >= self._renew_at:
                self._token, lifetime = self._fetch()
                self._renew_at = time.monotonic() + lifetime * REFRESH_FRACTION
            return self._token

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        req = urllib.request.Request(self.url, data=urllib.parse.urlencode(form).encode(), method="POST")
        req.add_header("Authorization", self._auth)
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                answer = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise TokenError(f"OIDC token endpoint {self.url} refused the client credentials: HTTP {exc.code}; "
                             "check kafka.sasl_oauthbearer_client_id and its secret") from None
        except (urllib.error.URLError, OSError) as exc:
            raise TokenError(f"OIDC token endpoint {self.url} unreachable: {getattr(exc, 'reason', exc)}") from None
        except ValueError:
            raise TokenError(f"OIDC token endpoint {self.url} sent a non-JSON answer") from None
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise TokenError(f"OIDC token endpoint {self.url} answered without an access_token")
        try:
            lifetime = float(answer.get("expires_in") or DEFAULT_LIFETIME_S)
        except (TypeError, ValueError):
            lifetime = DEFAULT_LIFETIME_S
        log.debug("OIDC token from %s, valid %.0fs", self.url, lifetime)
        return token, lifetime
