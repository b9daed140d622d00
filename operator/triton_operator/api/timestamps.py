"""The one timestamp format of the Kubernetes API (RFC 3339, UTC, "Z"), written and read back."""

from __future__ import annotations

import datetime as dt


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(at: dt.datetime | None = None, *, micro: bool = False) -> str:
    """`at` (default: now) as the API writes it: 2026-01-02T03:04:05Z, or with microseconds (an Event's eventTime)."""
    at = (at or utc_now()).astimezone(dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> dt.datetime | None:
    """A timestamp the API wrote, in UTC: whole seconds (conditions, startedAt) or fractional seconds (an Event's
    eventTime, the audit log's microseconds; digits past the microsecond are dropped). None for none; ValueError
    for text that is no timestamp. Without an offset, UTC."""
    if not text:
        return None
    at = dt.datetime.fromisoformat(text)
    return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
