"""Who may call perftracker's HTTP endpoints (query API, worker web, metrics).

Every endpoint binds 127.0.0.1 by default. Bound to any other address it needs
the ``http_token`` setting (a secret: ``PERFTRACKER_HTTP_TOKEN`` or
``PERFTRACKER_HTTP_TOKEN_FILE``), and :func:`check_bind` refuses to start it
without one. When a token is configured every request must carry
``Authorization: Bearer <token>`` (on loopback too), compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress

from .errors import ConfigError
from .settings import Secret

BEARER = "Bearer "


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the 127.0.0.0/8 and ::1 addresses; False for wildcards and the rest."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: Secret, setting: str) -> None:
    """Refuse to serve on ``host`` (named by ``setting``) beyond loopback without a bearer token."""
    if not is_loopback(host) and not token:
        raise ConfigError(f"{setting} = {host} serves beyond this machine: set a bearer token in "
                          "PERFTRACKER_HTTP_TOKEN (or PERFTRACKER_HTTP_TOKEN_FILE), or bind 127.0.0.1")


def authorized(header: str | None, token: Secret) -> bool:
    """Whether an ``Authorization`` header value passes: anything when no token is configured,
    else exactly ``Bearer <token>`` (constant-time comparison)."""
    if not token:
        return True
    if not header or not header.startswith(BEARER):
        return False
    return hmac.compare_digest(header[len(BEARER):].strip().encode(), token.reveal().encode())


def auth_headers(token: Secret) -> dict[str, str]:
    """The request header a client of these endpoints sends ({} without a token)."""
    return {"Authorization": BEARER + token.reveal()} if token else {}
