"""compare: FunctionPattern of every rank (keyed job|function) -> FunctionComparison per window."""

from __future__ import annotations

from typing import Any

from ...schemas.vocabulary import FUNCTION_COMPARISON
from ..context import StreamContext, now_ms
from ..detect import FunctionComparator

POLL_INTERVAL_S = 0.5


def register(app: Any, ctx: StreamContext) -> None:
    comparators: dict[tuple[str, str], FunctionComparator] = {}

    @app.agent(ctx.topics["patterns"], name="perftracker.compare")
    async def compare(stream: Any) -> None:
        async for raw in stream:
            decoded = await ctx.decode(ctx.pattern_codec, "patterns", raw)
            if decoded is None:
                continue
            _, pattern = decoded
            try:
                key = (pattern["job"], pattern["function"])
                if key not in comparators:
                    comparators[key] = FunctionComparator(key[0], key[1], ctx.policy)
                comparators[key].add(pattern, now_ms())
                ctx.count_in(ctx.pattern_codec.name)
            except Exception as exc:
                ctx.failed("compare", exc)

    @app.timer(POLL_INTERVAL_S)
    async def evaluate_windows() -> None:
        now = now_ms()
        for key, c in list(comparators.items()):
            try:
                for record in c.poll(now):
                    await ctx.topics["findings"].send(
                        key=record["job"].encode(), value=ctx.findings.encode(FUNCTION_COMPARISON, record))
                    ctx.count_out(FUNCTION_COMPARISON)
            except Exception as exc:
                ctx.failed("compare.tick", exc)
            if c.idle(now):
                del comparators[key]
