"""diagnose: RankWindow + FunctionComparison (keyed job) -> Anomaly lifecycle + Control requests."""

from __future__ import annotations

from typing import Any

from ..context import StreamContext, now_ms
from ..detect import JobDiagnoser

POLL_INTERVAL_S = 0.5


def register(app: Any, ctx: StreamContext) -> None:
    diagnosers: dict[str, JobDiagnoser] = {}

    @app.agent(ctx.topics["findings"], name="perftracker.diagnose")
    async def diagnose(stream: Any) -> None:
        async for raw in stream:
            decoded = await ctx.decode(ctx.findings, "findings", raw)
            if decoded is None:
                continue
            name, record = decoded
            try:
                job = record["job"]
                if job not in diagnosers:
                    diagnosers[job] = JobDiagnoser(job, ctx.policy)
                diagnosers[job].add(name, record, now_ms())
                ctx.count_in(name)
            except Exception as exc:
                ctx.failed("diagnose", exc)

    @app.timer(POLL_INTERVAL_S)
    async def conclude() -> None:
        now = now_ms()
        for job, d in list(diagnosers.items()):
            try:
                anomalies, controls = d.poll(now)
                for record in anomalies:
                    await ctx.topics["anomalies"].send(key=job.encode(), value=ctx.anomaly_codec.encode(record))
                    ctx.count_out(ctx.anomaly_codec.name, record["status"])
                    ctx.anomaly_sent(record)
                for record in controls:
                    await ctx.topics["control"].send(key=job.encode(), value=ctx.control_codec.encode(record))
                    ctx.count_out(ctx.control_codec.name)
            except Exception as exc:
                ctx.failed("diagnose.tick", exc)
            if d.idle(now):
                del diagnosers[job]
