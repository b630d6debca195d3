"""The SSE loop (keepalives, end of stream) and the wire format, without a server."""

from __future__ import annotations

import json

import anyio
import pytest

from durable_assets.kit.sse import KEEPALIVE, ServerSentEvent, event_stream, parse_last_event_id


def test_an_event_is_one_block_with_id_event_and_one_data_line() -> None:
    raw = ServerSentEvent(42, "progress", {"label": "a\nb", "done": 1}).encode().decode()
    assert raw.endswith("\n\n")
    lines = raw.rstrip("\n").split("\n")
    assert lines[:2] == ["id: 42", "event: progress"]
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2][len("data: ") :]) == {"label": "a\nb", "done": 1}


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("", None), ("17", 17), ("0", 0)])
def test_last_event_id_parses(raw: str | None, expected: int | None) -> None:
    assert parse_last_event_id(raw) == expected


@pytest.mark.parametrize("raw", ["x", " 1", "-1", "1.5", "\uff11\uff12", "1" * 19, "12abc"])
def test_malformed_last_event_id_is_rejected(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_last_event_id(raw)


def _collect(poll_results: list[tuple[list[ServerSentEvent], bool]], heartbeat_s: float) -> list[bytes]:
    calls = iter(poll_results)

    def poll() -> tuple[list[ServerSentEvent], bool]:
        return next(calls)

    async def main() -> list[bytes]:
        return [chunk async for chunk in event_stream(poll, poll_interval_s=0.01, heartbeat_s=heartbeat_s)]

    return anyio.run(main)


def test_silence_gets_keepalives_and_the_stream_ends_when_the_feed_does() -> None:
    event = ServerSentEvent(1, "status", {"status": "succeeded"})
    quiet: list[tuple[list[ServerSentEvent], bool]] = [([], False)] * 30  # >= 0.3 s of silence
    chunks = _collect([*quiet, ([event], True)], heartbeat_s=0.05)
    assert chunks[-1] == event.encode()
    assert chunks.count(KEEPALIVE) >= 2
    assert set(chunks[:-1]) == {KEEPALIVE}


def test_no_keepalive_while_events_flow() -> None:
    events = [([ServerSentEvent(i, "progress", {"done": i})], False) for i in range(1, 20)]
    chunks = _collect([*events, ([], True)], heartbeat_s=10.0)
    assert KEEPALIVE not in chunks and len(chunks) == 19


def test_a_failing_feed_ends_the_stream_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    def poll() -> tuple[list[ServerSentEvent], bool]:
        raise RuntimeError("database went away")

    async def main() -> list[bytes]:
        return [chunk async for chunk in event_stream(poll, poll_interval_s=0.01)]

    assert anyio.run(main) == []
    assert "database went away" in caplog.text
