"""POST one request with the standard library; errors become :class:`DeliveryError`."""

from __future__ import annotations

import urllib.error
import urllib.request

from .base import DeliveryError, HttpRequest


def post(req: HttpRequest, timeout_s: float) -> int:
    """Send ``req``; return the HTTP status (2xx). 429 and 5xx are retryable, other 4xx are not."""
    r = urllib.request.Request(req.url, data=req.body, method="POST",
                               headers={"Content-Type": "application/json", **req.headers})
    try:
        with urllib.request.urlopen(r, timeout=timeout_s) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        retryable = exc.code == 429 or exc.code >= 500
        raise DeliveryError(f"HTTP {exc.code}", retryable=retryable) from None
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, timeout
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{type(reason).__name__}: {reason}"[:200]) from None
