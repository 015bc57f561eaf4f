"""Generic JSON webhook with an HMAC-SHA256 signature.

Headers: ``X-Perftracker-Timestamp`` (unix seconds), ``X-Perftracker-Delivery``
(stable id of this incident event, for dedup), ``X-Perftracker-Dedup-Key`` (the incident
id, the same on every channel: body ``dedup_key``) and ``X-Perftracker-Signature:
v1=<hex>``, the HMAC-SHA256 of ``"<timestamp>.<body>"`` with the shared
secret. Receivers verify with :func:`verify_signature`, rejecting timestamps
older than a few minutes (replay) and delivery ids already seen.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

from ...schemas.settings import Secret
from .base import HttpRequest, Notification

TIMESTAMP_HEADER = "X-Perftracker-Timestamp"
SIGNATURE_HEADER = "X-Perftracker-Signature"
DELIVERY_HEADER = "X-Perftracker-Delivery"
EVENT_HEADER = "X-Perftracker-Event"
DEDUP_HEADER = "X-Perftracker-Dedup-Key"  # the incident id: the same on every channel and event


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(secret: str, timestamp: str, body: bytes, signature: str,
                     tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """True when ``signature`` matches and ``timestamp`` is within ``tolerance_s`` of now."""
    now = time.time() if now is None else now
    try:
        if abs(now - int(timestamp)) > tolerance_s:
            return False
    except ValueError:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


class WebhookChannel:
    name = "webhook"

    def __init__(self, url: str, secret: Secret):
        self.url = url
        self._secret = secret

    def request(self, n: Notification) -> HttpRequest:
        body = json.dumps({
            "version": 1, "event": n.event.value, "delivery_id": n.delivery_id,
            "dedup_key": n.incident.dedup_key,
            "dashboard_url": n.link(), "incident": n.incident.as_json(),
        }, sort_keys=True).encode()
        ts = str(int(time.time()))
        headers = {TIMESTAMP_HEADER: ts, DELIVERY_HEADER: n.delivery_id, EVENT_HEADER: n.event.value,
                   DEDUP_HEADER: n.incident.dedup_key}
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret.reveal(), ts, body)
        return HttpRequest(self.url, body, headers)
