"""api.timestamps: the API's RFC 3339 timestamps written and read back."""

from __future__ import annotations

import datetime as dt

import pytest

from triton_operator.api.timestamps import parse_rfc3339, rfc3339

AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_seconds_as_conditions_keep_them() -> None:
    assert rfc3339(AT) == "2026-01-02T03:04:05Z"
    assert parse_rfc3339("2026-01-02T03:04:05Z") == AT


@pytest.mark.parametrize(("text", "micros"), [
    ("2026-01-02T03:04:05.123456Z", 123456),  # an Event's eventTime, the audit log's requestReceivedTimestamp
    ("2026-01-02T03:04:05.5Z", 500000),
    ("2026-01-02T03:04:05.123456789Z", 123456),  # nanoseconds: past the microsecond dropped
])
def test_fractional_seconds(text: str, micros: int) -> None:
    assert parse_rfc3339(text) == AT.replace(microsecond=micros)


def test_microseconds_round_trip() -> None:
    at = AT.replace(microsecond=654321)
    assert parse_rfc3339(rfc3339(at, micro=True)) == at


def test_offsets_become_utc() -> None:
    parsed = parse_rfc3339("2026-01-02T05:04:05+02:00")
    assert parsed == AT and parsed is not None and parsed.tzinfo == dt.UTC
    assert parse_rfc3339("2026-01-02T03:04:05") == AT  # no offset: UTC


def test_none_and_garbage() -> None:
    assert parse_rfc3339(None) is None
    assert parse_rfc3339("") is None
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")
