"""Slack incoming webhook: a readable message (who, what, why, cost, link)."""

from __future__ import annotations

import json

from ...schemas.settings import Secret
from .base import Event, HttpRequest, Notification

_ICON = {Event.OPEN: ":rotating_light:", Event.UPDATE: ":warning:", Event.RESOLVE: ":white_check_mark:"}
_VERB = {Event.OPEN: "New", Event.UPDATE: "Ongoing", Event.RESOLVE: "Resolved"}


def _escape(text: str) -> str:
    """Slack mrkdwn control characters (so a hostile job name cannot inject a link or mention)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackChannel:
    name = "slack"

    def __init__(self, url: Secret):
        self._url = url

    def request(self, n: Notification) -> HttpRequest:
        i = n.incident
        title = (f"{_ICON[n.event]} {_VERB[n.event]} perftracker incident in job "
                 f"*{_escape(i.job)}*: {_escape(i.cause)}")
        fields = [
            f"*Who:* {_escape(i.who())}",
            f"*What:* {_escape(i.kind)} in `{_escape(i.function)}`",
            f"*Why:* {_escape(i.summary)}",
            f"*Cost:* {i.impact_ms_per_step:.1f} ms per step (step {i.step_time_ms:.1f} ms)",
            f"*Incident:* `{_escape(i.dedup_key)}`",
        ]
        if n.event is Event.RESOLVE and i.resolved_reason:
            fields.append(f"*Resolved:* {_escape(i.resolved_reason)}")
        blocks: list[dict] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": title}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        ]
        link = n.link()
        if link:
            blocks.append({"type": "actions", "elements": [{
                "type": "button", "text": {"type": "plain_text", "text": "Open dashboard"}, "url": link}]})
        text = f"{_VERB[n.event]}: {i.job} {i.cause} on {i.who()}, {i.impact_ms_per_step:.1f} ms/step"
        if n.event is Event.RESOLVE and i.resolved_reason:
            text += f" ({i.resolved_reason})"
        # metadata: the incident id, the same dedup key as the webhook's and PagerDuty's
        body = json.dumps({"text": text, "blocks": blocks, "metadata": {
            "event_type": f"perftracker_incident_{n.event.value}",
            "event_payload": {"dedup_key": i.dedup_key, "resolved_reason": i.resolved_reason}}}).encode()
        return HttpRequest(self._url.reveal(), body, {})
