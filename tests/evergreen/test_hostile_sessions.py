"""Hostile Evergreen clients against a real ``serve --engine sim --evergreen-port N``: ids of
megabytes, a client that never reads, sessions abandoned without a half-close, an idle
session, malformed messages, and an ``x-run`` that HTTP would refuse. Each is refused or
bounded while a ``/healthz`` poller sees the server answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
import pytest
from google.protobuf import any_pb2  # type: ignore[import-untyped]

from tests.evergreen.upstream import (
    METHOD,
    PUBLISHED,
    Outcome,
    action,
    generate_config,
    message,
    metadata,
    parent,
    sent,
    start,
    text,
)
from tests.hostile import Server, poller, serve
from tests.procs import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20


@dataclass
class Door:
    server: Server
    port: int  # the Evergreen door's
    flow_id: str

    def md(self, run: dict[str, Any] | None = None) -> list[tuple[str, str]]:
        return metadata(self.flow_id, run)

    def get(self, path: str) -> Any:
        return httpx.get(self.server.url + path, timeout=30).json()

    def log(self) -> str:
        return "".join(p.read_text() for p in self.server.data_dir.glob("proc-*.log"))


@contextlib.contextmanager
def door(tmp_path: Path, **evergreen: Any) -> Iterator[Door]:
    """A real server with its Evergreen door, settings (``evergreen.*``, or a full
    ``ORCHESTRATORD_...`` name) from ``evergreen``, and a flow."""
    env = {
        k if k.startswith("ORCHESTRATORD_") else f"ORCHESTRATORD_EVERGREEN__{k.upper()}": str(v)
        for k, v in evergreen.items()
    }
    port = free_port()
    with serve(tmp_path, "--engine", "sim", "--evergreen-port", str(port), env=env) as server:
        flow = httpx.post(f"{server.url}/v1/flows", json={"ast": {"hostile": 1}}).json()
        yield Door(server, port, flow["flow_id"])


def _channel(port: int, **options: Any) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=list(options.items()))


def _call(channel: grpc.aio.Channel, requests: Any, md: list[tuple[str, str]]) -> Any:
    return channel.stream_stream(
        METHOD,
        request_serializer=PUBLISHED.SessionMessage.SerializeToString,
        response_deserializer=PUBLISHED.SessionMessage.FromString,
    )(requests, metadata=md, timeout=120)


async def _ended(call: Any) -> Outcome:
    """How a call ended, its replies read."""
    out = Outcome()
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for reply in call:
            out.replies.append(reply)
    out.code, out.details = await call.code(), await call.details() or ""
    out.initial = dict(await call.initial_metadata() or ())
    out.trailing = dict(await call.trailing_metadata() or ())
    return out


async def _held_open(*messages: Any) -> AsyncIterator[Any]:
    """``messages``, then no half-close."""
    for m in messages:
        yield m
    await asyncio.sleep(3600)


def _no_traceback(d: Door) -> None:
    log = d.log()
    assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:3000]


# -- ids ------------------------------------------------------------------------------------


def _flood(d: Door, fragments: Iterator[Any]) -> Outcome:
    """One session sending each fragment in a message of its own, until the server ends it
    (a synchronous client: grpc.aio's reports a call the server ended while it was writing
    as its own INTERNAL error)."""
    with grpc.insecure_channel(f"127.0.0.1:{d.port}") as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=PUBLISHED.SessionMessage.SerializeToString,
            response_deserializer=PUBLISHED.SessionMessage.FromString,
        )((message(f) for f in fragments), metadata=d.md(), timeout=120)
        out = Outcome()
        with contextlib.suppress(grpc.RpcError):
            out.replies.extend(call)
        out.code, out.details = call.code(), call.details() or ""
        out.trailing = dict(call.trailing_metadata() or ())
        return out


def test_ids_of_megabytes_are_refused_before_the_server_holds_them(tmp_path: Path) -> None:
    """250 ids of 3 MB held 720 MB more; now the first is refused (``max_id_bytes``), and ids
    that are each short enough count in ``max_bytes``."""
    with door(tmp_path) as d, poller(d.server.url) as probes:
        before = d.server.rss_mb()
        big = (text(f"{n:04d}" + "i" * (3 * MB), "x") for n in range(250))
        out = _flood(d, big)
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details
        assert "max_id_bytes (1024)" in out.details
        assert len(out.details) < 4096  # the id is not echoed whole
        # 250 messages of 3,000 child ids of 1 KB: each id short, 750 MB of them in all
        many = (
            parent(f"p{n}", *(f"{n}.{i}." + "c" * 1000 for i in range(3000))) for n in range(250)
        )
        out = _flood(d, many)
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details
        assert "max_bytes (67108864)" in out.details
        assert out.error["code"] == "RESOURCE_EXHAUSTED"
        grown = d.server.peak_rss_mb() - before
        print(f"server RSS growth: {grown:.0f} MB")
        assert grown < 200
    probes.report.check("ids of megabytes")
    _no_traceback(d)


# -- a client that does not read ------------------------------------------------------------


def _tokens_so_far(url: str, step_id: str) -> int:
    """The step's token events stored so far: its stream read until it falls quiet."""
    count = 0
    timeout = httpx.Timeout(30, read=0.5)
    with (
        contextlib.suppress(httpx.ReadTimeout),
        httpx.stream("GET", f"{url}/v1/steps/{step_id}/stream", timeout=timeout) as r,
    ):
        for line in r.iter_lines():
            count += line == "event: token"
    return count


def test_a_client_that_does_not_read_holds_the_generation_not_the_memory(
    tmp_path: Path,
) -> None:
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "20000", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
    with door(tmp_path, **env) as d, poller(d.server.url) as probes:
        before = d.server.rss_mb()
        generate = action(
            "GENERATE",
            {"prompt": "q"},
            {"response": "r"},
            configs=[generate_config(max_tokens=131072)],
        )

        async def session() -> tuple[str, list[int], str]:
            # a window of 64 KB (grpc grows it to 4 MB otherwise, more than the whole output):
            # the server's sends stop soon, and then its generation
            async with _channel(d.port, **{"grpc.http2.bdp_probe": 0}) as channel:
                call = _call(channel, _held_open(message(text("q", "go on"), generate)), d.md())
                run_id = dict(await call.initial_metadata())["x-run-id"]
                counts = []
                for _ in range(3):
                    await asyncio.sleep(1.5)
                    (step,) = d.get(f"/v1/runs/{run_id}/steps")
                    counts.append(
                        await asyncio.to_thread(_tokens_so_far, d.server.url, step["step_id"])
                    )
                status = d.get(f"/v1/steps/{step['step_id']}")["status"]
                call.cancel()
                return run_id, counts, status

        run_id, counts, status = asyncio.run(session())
        grown = d.server.peak_rss_mb() - before
        print(f"tokens stored at 1.5 s, 3 s, 4.5 s: {counts}; server RSS growth {grown:.0f} MB")
        assert status == "running"  # neither ended nor run to max_tokens
        assert 0 < counts[1] == counts[2] < 131072  # paused: not a token more
        assert grown < 100
        for _ in range(100):
            if d.get(f"/v1/runs/{run_id}")["status"] == "cancelled":
                break
            time.sleep(0.1)
        assert d.get(f"/v1/runs/{run_id}")["status"] == "cancelled"
    probes.report.check("a client that does not read")


# -- sessions abandoned, idle ---------------------------------------------------------------

_ABANDONING = textwrap.dedent(
    """
    import asyncio, json, sys
    import grpc
    from tests.evergreen.upstream import (
        METHOD, PUBLISHED, action, generate_config, message, metadata, text,
    )
    port, flow, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    async def one(channel, i):
        # half of them with an action that runs, half waiting for an input never sent
        prompt = "q" if i % 2 else "never"
        first = message(
            text("q", "x" * 100_000),
            action("GENERATE", {"prompt": prompt}, {"response": "r"},
                   configs=[generate_config(max_tokens=4)]),
        )
        async def requests():
            yield first
            await asyncio.sleep(3600)  # no half-close
        call = channel.stream_stream(
            METHOD,
            request_serializer=PUBLISHED.SessionMessage.SerializeToString,
            response_deserializer=PUBLISHED.SessionMessage.FromString,
        )(requests(), metadata=metadata(flow))
        return dict(await call.initial_metadata())["x-run-id"], call

    async def main():
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        opened = await asyncio.gather(*(one(channel, i) for i in range(n)))
        print(json.dumps([run_id for run_id, _ in opened]), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def _statuses(d: Door, run_ids: list[str]) -> dict[str, int]:
    """How many of ``run_ids`` are in each status."""
    wanted = set(run_ids)
    found: dict[str, int] = {}
    for run in d.get(f"/v1/runs?flow_id={d.flow_id}&limit=1000"):
        if run["run_id"] in wanted:
            found[run["status"]] = found.get(run["status"], 0) + 1
    return found


def test_sessions_abandoned_without_a_half_close_cancel_their_runs(tmp_path: Path) -> None:
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__SLOTS": "64"}
    with door(tmp_path, **env) as d, poller(d.server.url) as probes:
        before = d.server.rss_mb()
        client = subprocess.Popen(
            [sys.executable, "-c", _ABANDONING, str(d.port), d.flow_id, "200"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdout is not None
            run_ids = json.loads(client.stdout.readline())
            time.sleep(1.0)  # the runnable actions ran
            held = d.server.rss_mb() - before
        finally:
            client.send_signal(signal.SIGKILL)  # gone: no half-close, no cancel
            client.wait()
            assert client.stdout is not None
            client.stdout.close()
        for _ in range(100):
            found = _statuses(d, run_ids)
            if found.get("cancelled") == len(run_ids):
                break
            time.sleep(0.2)
        for _ in range(50):  # the sessions' memory handed back once the door is idle
            after = d.server.rss_mb() - before
            if after < held / 3:
                break
            time.sleep(0.1)
        print(f"runs: {found}; server RSS {held:+.0f} MB with 200 sessions, {after:+.0f} MB after")
        assert found == {"cancelled": 200}
        assert after < held / 2
    probes.report.check("200 abandoned sessions")
    _no_traceback(d)


def test_an_idle_session_is_ended_and_its_run_cancelled(tmp_path: Path) -> None:
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "20000", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
    with door(tmp_path, idle_timeout_s=1.0, **env) as d, poller(d.server.url) as probes:

        async def silent() -> Outcome:
            async with _channel(d.port) as channel:
                return await _ended(_call(channel, _held_open(message(text("q", "hi"))), d.md()))

        async def not_reading() -> tuple[Outcome, float]:
            generate = action(
                "GENERATE",
                {"prompt": "q"},
                {"response": "r"},
                configs=[generate_config(max_tokens=131072)],
            )
            async with _channel(d.port, **{"grpc.http2.bdp_probe": 0}) as channel:
                call = _call(channel, _held_open(message(text("q", "go"), generate)), d.md())
                await call.initial_metadata()
                began = time.monotonic()
                await asyncio.sleep(4)  # reads nothing meanwhile
                return await _ended(call), began

        began = time.monotonic()
        out = asyncio.run(silent())
        took = time.monotonic() - began
        assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED, out.details
        assert "evergreen.idle_timeout_s" in out.details
        assert out.error["details"]["limit"] == "evergreen.idle_timeout_s"
        assert 1.0 <= took < 3.0
        assert d.get(f"/v1/runs/{out.run_id}")["status"] == "cancelled"

        out, _ = asyncio.run(not_reading())
        assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED, out.details
        assert out.replies  # what it was sent came first
        assert d.get(f"/v1/runs/{out.run_id}")["status"] == "cancelled"
        (step,) = d.get(f"/v1/runs/{out.run_id}/steps")
        assert step["status"] == "cancelled"
    probes.report.check("idle sessions")
    _no_traceback(d)


# -- malformed messages ---------------------------------------------------------------------


async def _raw(d: Door, *chunks: bytes) -> Outcome:
    async def requests() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async with _channel(d.port) as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=lambda b: b,
            response_deserializer=PUBLISHED.SessionMessage.FromString,
        )(requests(), metadata=d.md(), timeout=60)
        return await _ended(call)


def _bad_config() -> Any:
    packed = any_pb2.Any(type_url=generate_config().type_url, value=b"\xff\xff\xff")
    return message(
        text("q", "hi"), action("GENERATE", {"prompt": "q"}, {"response": "r"}, configs=[packed])
    )


def _id_not_utf8() -> bytes:
    valid: bytes = message(text("q", "hi")).SerializeToString()
    return valid.replace(b"\n\x01q", b"\n\x01\xff", 1)  # NodeFragment.id: one byte, not UTF-8


NOT_A_MESSAGE = "is not an evergreen.v2.SessionMessage"
MALFORMED = {  # what is sent: what the status says
    b"\xff\xff\xff\xff garbage": NOT_A_MESSAGE,
    b"\x0a\x80\x80\x80\x80\x80\x80": NOT_A_MESSAGE,  # a field's length that never ends
    _id_not_utf8(): NOT_A_MESSAGE,
    _bad_config().SerializeToString(): "a config is not a valid orchestratord.evergreen.v1",
}


def test_a_malformed_message_is_invalid_argument_without_a_traceback(tmp_path: Path) -> None:
    with door(tmp_path) as d, poller(d.server.url) as probes:
        for raw, says in MALFORMED.items():
            out = asyncio.run(_raw(d, raw))
            assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (raw, out.code, out.details)
            assert says in out.details, out.details
            assert d.get(f"/v1/runs/{out.run_id}")["status"] == "failed"
    probes.report.check("malformed messages")
    _no_traceback(d)
    assert d.log().count("is not an evergreen.v2.SessionMessage") == 3  # one line each


# -- x-run ----------------------------------------------------------------------------------


def test_x_run_is_read_as_an_http_body_is(tmp_path: Path) -> None:
    limits = {"ORCHESTRATORD_LIMITS__MAX_BODY_BYTES": "1024"}
    with door(tmp_path, **limits) as d, poller(d.server.url) as probes:

        def opened(run: str) -> Outcome:
            return asyncio.run(start(d.port, [("x-flow-id", d.flow_id), ("x-run", run)], sent()))

        out = opened('{"seed": 1, "budgets": {}, "seed": 2}')
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT, out.details
        assert "'seed' twice" in out.details
        assert out.error["details"]["errors"][0]["field"] == "x-run.seed"
        http = httpx.post(
            f"{d.server.url}/v1/flows/{d.flow_id}/runs",
            content='{"seed": 1, "seed": 2}',
            headers={"content-type": "application/json"},
        )
        assert (
            http.status_code == 400 and http.json()["details"]["errors"][0]["field"] == "body.seed"
        )

        # the same model, its errors naming the same field (a placement's form left out)
        bad = {"seed": 1, "pool_policy": {"pin": 5}}
        http = httpx.post(f"{d.server.url}/v1/flows/{d.flow_id}/runs", json=bad)
        assert http.status_code == 422
        field = http.json()["details"]["errors"][0]["field"]
        out = opened(json.dumps(bad))
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT, out.details
        assert out.error["details"]["errors"][0]["field"] == f"x-run.{field}"
        assert out.details.startswith(f"x-run.{field}: ")

        out = opened(json.dumps({"seed": 1, "policy": {"rules": []}, "pad": "p" * 1100}))
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details
        assert out.error["details"]["limit"] == "limits.max_body_bytes"

        out = opened(json.dumps({"seed": 1, "pad": "p" * 20_000}))  # past the header bytes
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details

        out = opened('{"seed": 1')
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT and "malformed JSON" in out.details
        out = opened('{"seed": 3}')
        assert out.code == grpc.StatusCode.OK, out.details
    probes.report.check("x-run")
    _no_traceback(d)


def test_actions_waiting_to_run_are_bounded(tmp_path: Path) -> None:
    with door(tmp_path, max_pending_actions=5) as d:
        waiting = [action("GENERATE", {"prompt": "never"}, {"response": f"r{n}"}) for n in range(6)]
        out = asyncio.run(start(d.port, d.md(), _held_open(message(*waiting))))
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details
        assert "evergreen.max_pending_actions (5)" in out.details
