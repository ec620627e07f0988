"""What an engine may send, at the adapter and at the step: a stream line past the token cap
is not read further, an error body is read up to its cap, a head without end is refused,
``Retry-After`` is read; a token or an output past its limit, an idle engine and the
default deadline end a call (``orchestratord.steps.engine_limits``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from orchestratord.settings import EngineLimitSettings
from orchestratord.steps.engine_limits import OutputMeter, busy_wait_s, utf8_len, watchdog
from tests.adapters.test_http1 import raw_server, read_request
from worker_adapters import EngineFailure, EngineOverLimit, Finish, GenerationRequest, Token
from worker_adapters.http1 import MAX_HEAD_BYTES, Broken, Http1Client
from worker_adapters.openai import OpenAIAdapter, line_cap

MB = 1 << 20
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _request() -> GenerationRequest:
    return GenerationRequest(request_id="r", prompt="hi", messages=None, seed=1, max_tokens=4)


def _event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


async def _stream(write: Writer, **adapter: int) -> tuple[list[object], list[int]]:
    """What an OpenAIAdapter makes of an engine that answers with ``write``, and the bytes the
    engine managed to write before the client left."""
    sent = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        real = writer.write

        def counting(data: bytes | bytearray | memoryview) -> None:
            sent[0] += len(data)
            real(data)

        writer.write = counting  # type: ignore[method-assign]
        with contextlib.suppress(ConnectionError):
            await write(writer)

    async with raw_server(handler) as (address, _):
        client = OpenAIAdapter(base_url=f"http://{address}/v1", **adapter)  # type: ignore[arg-type]
        events: list[object] = []
        try:
            async for event in client.stream(_request()):
                events.append(event)
        except EngineFailure as exc:
            events.append(exc)
        finally:
            await client.aclose()
    return events, sent


async def _huge_token(writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + b'data: {"choices":[{"index":0,"text":"')
    for _ in range(64):  # 64 MB, a megabyte a write
        writer.write(b"a" * MB)
        await writer.drain()
    writer.write(b'","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    await writer.drain()


async def test_a_stream_line_past_the_token_cap_is_not_read_further() -> None:
    events, sent = await _stream(_huge_token, max_token_bytes=64 << 10)
    error = events[-1]
    assert isinstance(error, EngineOverLimit), events
    assert error.reason == "token_too_large" and error.limit == "engine_limits.max_token_bytes"
    assert not error.retriable
    # the engine could write no more than the cap and what the sockets hold: not 64 MB
    assert sent[0] < 16 * MB, sent


async def test_lines_split_across_writes_are_whole_and_the_cap_counts_a_line_only() -> None:
    token = "x" * (60 << 10)  # under the cap of 64 KiB, in a line of ~60 KiB

    async def pieces(writer: asyncio.StreamWriter) -> None:
        body = _event(token) * 20 + _event("", "stop") + b"data: [DONE]\r\n\r\n"
        writer.write(SSE_HEAD)
        for at in range(0, len(body), 1000):  # 1,000 bytes a write: lines cut anywhere
            writer.write(body[at : at + 1000])
            await writer.drain()

    events, _ = await _stream(pieces, max_token_bytes=64 << 10)
    assert [e.text for e in events if isinstance(e, Token)] == [token] * 20
    assert isinstance(events[-1], Finish)


def test_a_line_can_hold_a_token_at_the_cap_written_as_json_escapes() -> None:
    token = "\x00" * 1024
    line = b"data: " + json.dumps({"choices": [{"index": 0, "text": token}]}).encode()
    assert len(line) <= line_cap(1024)


async def test_an_error_body_is_read_up_to_its_cap() -> None:
    async def huge_error(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 500 Oops\r\ncontent-length: %d\r\n\r\n" % (64 * MB))
        for _ in range(64):
            writer.write(b"e" * MB)
            await writer.drain()

    events, sent = await _stream(huge_error, max_error_bytes=4096)
    error = events[-1]
    assert isinstance(error, EngineFailure) and "HTTP 500" in error.message
    assert len(error.message) < 300
    assert sent[0] < 16 * MB, sent


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (429, b"retry-after: 2", 2000),
        (503, b"retry-after: 0", 0),
        (429, b"retry-after: Wed, 21 Oct 2015 07:28:00 GMT", 0),  # a date past
        (429, b"retry-after: soon", None),
        (500, b"retry-after: 2", None),  # not a status Retry-After asks a retry on
        (429, b"x-other: 1", None),
    ],
)
async def test_retry_after_is_read_from_429_and_503(
    status: int, header: bytes, expected: int | None
) -> None:
    async def busy(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 %d Busy\r\n%s\r\ncontent-length: 2\r\n\r\n{}" % (status, header))
        await writer.drain()

    events, _ = await _stream(busy)
    error = events[-1]
    assert isinstance(error, EngineFailure) and error.retriable
    assert error.retry_after_ms == expected


async def test_a_head_that_never_ends_is_refused() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-long: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                writer.write(b"h" * MB)
                await writer.drain()

    async with raw_server(endless) as (address, _):
        client = Http1Client(f"http://{address}")
        with pytest.raises(Broken, match=f"over {MAX_HEAD_BYTES} bytes of head"):
            await client.request("GET", "/")
        await client.aclose()


async def test_a_body_read_whole_stops_at_its_cap() -> None:
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (8 * MB))
        with contextlib.suppress(ConnectionError):
            for _ in range(8):
                writer.write(b"b" * MB)
                await writer.drain()

    async with raw_server(big) as (address, _):
        client = Http1Client(f"http://{address}")
        assert await client.request("GET", "/", max_bytes=1000) == (200, b"b" * 1000)
        await client.aclose()


# -- the step's limits, whatever the engine ---------------------------------------------------


def _limits(**kw: Any) -> EngineLimitSettings:
    return EngineLimitSettings(**kw)


def test_a_token_past_max_token_bytes_is_refused_and_not_counted() -> None:
    meter = OutputMeter(_limits(max_token_bytes=1024, max_output_bytes=4096))
    meter.take("é" * 512)  # 1024 bytes: at the cap
    with pytest.raises(EngineOverLimit) as info:
        meter.take("é" * 513)
    assert info.value.reason == "token_too_large" and not info.value.retriable
    assert meter.total == 1024


def test_an_output_past_max_output_bytes_is_refused_at_the_token_that_passes_it() -> None:
    meter = OutputMeter(_limits(max_token_bytes=1024, max_output_bytes=2048))
    meter.take("a" * 1024)
    meter.take("a" * 1024)
    with pytest.raises(EngineOverLimit) as info:
        meter.take("a")
    assert info.value.reason == "output_too_large"
    assert info.value.limit == "engine_limits.max_output_bytes"
    assert meter.total == 2048


def test_utf8_len_counts_bytes() -> None:
    assert utf8_len("abc") == 3 and utf8_len("é") == 2 and utf8_len("\ud800") == 3


async def test_an_idle_engine_is_let_go_and_a_waiting_reader_is_not_idle() -> None:
    limits = _limits(idle_timeout_s=0.05)
    loop = asyncio.get_running_loop()
    asked = [loop.time()]
    error = await watchdog(lambda: asked[0], limits, None)
    assert error.reason == "engine_idle" and error.retriable

    asked[0] = math.inf  # the step waits for its readers: not the engine's idle
    watch = asyncio.create_task(watchdog(lambda: asked[0], limits, None))
    await asyncio.sleep(0.2)
    assert not watch.done()
    watch.cancel()


async def test_the_default_deadline_ends_a_call_that_is_never_idle() -> None:
    limits = _limits(idle_timeout_s=60, step_deadline_s=1)
    loop = asyncio.get_running_loop()
    error = await watchdog(loop.time, limits, loop.time() + 0.05)
    assert error.reason == "step_deadline" and not error.retriable
    assert "max_wall_ms" in error.message


def test_a_busy_engine_is_waited_for_within_the_deadline_and_before_any_token() -> None:
    assert busy_wait_s(2000, streamed=False, elapsed_s=1, deadline_s=10) == 2
    assert busy_wait_s(2000, streamed=False, elapsed_s=8.5, deadline_s=10) is None
    assert busy_wait_s(2000, streamed=True, elapsed_s=0, deadline_s=10) is None
    assert busy_wait_s(None, streamed=False, elapsed_s=0, deadline_s=10) is None
