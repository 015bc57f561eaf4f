"""summarize: EventBatch/HardwareBatch (keyed job|rank) -> FunctionPattern + RankWindow per closed window."""

from __future__ import annotations

from typing import Any

from ...schemas.vocabulary import FUNCTION_PATTERN, HARDWARE_BATCH
from ..context import StreamContext, now_ms
from ..detect import RankSummarizer
from ..gaps import GapMetrics

POLL_INTERVAL_S = 0.5


def register(app: Any, ctx: StreamContext) -> None:
    summarizers: dict[tuple[str, int], RankSummarizer] = {}
    gaps = GapMetrics(ctx.counters)

    def summarizer_for(record: dict) -> RankSummarizer:
        key = (record["job"], int(record["rank"]))
        if key not in summarizers:
            summarizers[key] = RankSummarizer(key[0], key[1], ctx.policy)
        return summarizers[key]

    @app.agent(ctx.topics["inputs"], name="perftracker.summarize")
    async def summarize(stream: Any) -> None:
        async for raw in stream:
            decoded = await ctx.decode(ctx.inputs, "inputs", raw)
            if decoded is None:
                continue
            name, record = decoded
            try:
                s = summarizer_for(record)
                now = now_ms()
                if name == HARDWARE_BATCH:
                    s.add_hardware(record, now)
                else:
                    s.add_events(record, now)
                    gaps.batch_in(s.job, s.rank, s.health.lost_batches, s.health.dropped_events, record)
                ctx.count_in(name)
                await emit(ctx, s.poll(now))
            except Exception as exc:
                ctx.failed("summarize", exc)

    @app.timer(POLL_INTERVAL_S)
    async def close_windows() -> None:
        now = now_ms()
        for key, s in list(summarizers.items()):
            try:
                await emit(ctx, s.poll(now))
            except Exception as exc:
                ctx.failed("summarize.tick", exc)
            if s.idle(now):
                del summarizers[key]
                gaps.forget(*key)


async def emit(ctx: StreamContext, closed: list[tuple[str, dict]]) -> None:
    for name, record in closed:
        if name == FUNCTION_PATTERN:
            key = f"{record['job']}|{record['function']}".encode()
            await ctx.topics["patterns"].send(key=key, value=ctx.pattern_codec.encode(record))
        else:
            await ctx.topics["findings"].send(key=record["job"].encode(), value=ctx.findings.encode(name, record))
            ctx.window_closed(record)
        ctx.count_out(name)
