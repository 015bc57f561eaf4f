"""Worker health endpoint: GET /perftracker/stats/ -> counters and assigned partitions."""

from __future__ import annotations

from typing import Any

from .context import StreamContext


def register_views(app: Any, ctx: StreamContext) -> None:
    @app.page("/perftracker/stats/")
    async def stats(web: Any, request: Any) -> Any:
        assigned = sorted(f"{tp.topic}:{tp.partition}" for tp in app.consumer.assignment()) \
            if app.consumer is not None else []
        return web.json({"counters": ctx.counters.snapshot(), "assigned": assigned})
