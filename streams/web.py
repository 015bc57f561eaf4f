"""Worker health endpoint: GET /perftracker/stats/ -> counters and assigned partitions.

The Faust web server binds ``streams.web_host`` (default 127.0.0.1). With the
``http_token`` setting every request to it (this page and Faust's own) must carry
``Authorization: Bearer <token>`` (401 otherwise); beyond loopback the token is
required (:func:`perftracker_ml.schemas.http_auth.check_bind`).
"""

from __future__ import annotations

from typing import Any

from ..schemas.http_auth import authorized
from ..schemas.settings import Secret
from .context import StreamContext


def register_views(app: Any, ctx: StreamContext) -> None:
    @app.page("/perftracker/stats/")
    async def stats(web: Any, request: Any) -> Any:
        return web.json({"counters": ctx.counters.snapshot(), "assigned": _assigned(app)})


def _assigned(app: Any) -> list[str]:
    """``topic:partition`` of the partitions assigned to this worker ([] before its consumer started)."""
    try:
        return sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment())
    except Exception:  # ConsumerNotStarted, or no consumer yet
        return []


def web_application_options(token: Secret) -> dict[str, Any]:
    """Faust's ``web_application_options``: the aiohttp middleware that checks the bearer token."""
    if not token:
        return {}
    from aiohttp import web

    @web.middleware
    async def require_token(request: Any, handler: Any) -> Any:
        if not authorized(request.headers.get("Authorization"), token):
            return web.json_response({"error": "missing or wrong bearer token (Authorization: Bearer <http_token>)"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return {"middlewares": [require_token]}
