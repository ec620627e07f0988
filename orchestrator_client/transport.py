"""Sending a :class:`~orchestrator_client.calls.Call`, blocking or async, with retries.

A refusal the server marks retriable (429, 503: a full queue, no ready pool, an open breaker)
is retried after the wait it asks for (``Retry-After`` / ``retry_after_ms``), else after an
exponential backoff with jitter; so is a lost connection. Every route is safe to repeat (see
``calls.Call``): the server may have done the work before its answer was lost, and the
write's ``client_token`` (or its content) makes the repeat answer that work.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

import httpx

from orchestrator_client import __version__
from orchestrator_client.calls import Call
from orchestrator_client.errors import ApiError, ClientError, Unreachable

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """How many times, and how long to wait, between tries of one call."""

    attempts: int = 5
    """Tries in all (1: never retry)."""
    backoff_s: float = 0.2
    """The first wait when the server names none; it doubles, with jitter."""
    max_wait_s: float = 10.0
    """No single wait is longer, whatever the server asks."""

    def wait(self, attempt: int, error: ClientError) -> float | None:
        """Seconds to wait before try ``attempt + 1`` after ``error``; None: give up."""
        if attempt + 1 >= self.attempts or not error.retriable:
            return None
        asked = error.retry_after_s if isinstance(error, ApiError) else None
        if asked is not None:
            return min(asked, self.max_wait_s)
        backoff = self.backoff_s * 2.0**attempt
        return min(backoff * (0.5 + random.random()), self.max_wait_s)


def describe(exc: httpx.HTTPError) -> str:
    return f"{type(exc).__name__}: {str(exc) or 'no detail'}"


def _answer(call: Call[T], response: httpx.Response) -> T:
    if response.status_code >= 400:
        raise ApiError.from_response(response)
    try:
        return call.read(response.content)
    except ValueError as exc:
        raise ApiError(
            response.status_code,
            {"code": "BAD_RESPONSE", "message": f"{call.method} {call.url}: {exc}"},
        ) from exc


def _request(call: Call[Any]) -> dict[str, Any]:
    return {
        "method": call.method,
        "url": call.url,
        "params": dict(call.query) or None,
        "json": call.body,
    }


class Options(TypedDict, total=False):
    api_key: str | None
    timeout: float
    retry: Retry | None
    stream_give_up_s: float
    user_agent: str | None


class _Settings:
    """What both transports are given: where the server is, the key, and the waits.

    ``base_url`` defaults to ``$ORCHESTRATOR_URL`` (else ``http://127.0.0.1:8080``) and
    ``api_key`` to ``$ORCHESTRATOR_API_KEY``. ``timeout`` bounds each wait for the server,
    including the silence between two events of a stream (the server sends keep-alives);
    ``stream_give_up_s`` is how long a dropped stream is retried without an answer.
    """

    def __init__(self, base_url: str | None = None, **options: Unpack[Options]) -> None:
        url = base_url or os.environ.get("ORCHESTRATOR_URL") or "http://127.0.0.1:8080"
        self.base_url = url.rstrip("/")
        self.retry = options.get("retry") or Retry()
        self.timeout = options.get("timeout", 30.0)
        self.stream_give_up_s = options.get("stream_give_up_s", 60.0)
        key = options.get("api_key") or os.environ.get("ORCHESTRATOR_API_KEY")
        agent = options.get("user_agent") or f"orchestrator-client/{__version__}"
        self.headers = {"User-Agent": agent}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"


class SyncTransport(_Settings):
    """The blocking half: an ``httpx.Client`` and the retry loop."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Unpack[Options],
    ) -> None:
        super().__init__(base_url, **options)
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.timeout),
            headers=self.headers,
            transport=transport,
        )

    def send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                return self._once(call)
            except ClientError as error:
                wait = self.retry.wait(attempt, error)
                if wait is None:
                    raise
            time.sleep(wait)
            attempt += 1

    def _once(self, call: Call[T]) -> T:
        try:
            response = self.http.request(**_request(call))
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {self.base_url}{call.url}: {describe(exc)}") from exc
        return _answer(call, response)

    def close(self) -> None:
        self.http.close()


class AsyncTransport(_Settings):
    """The async half: an ``httpx.AsyncClient`` and the retry loop."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[Options],
    ) -> None:
        super().__init__(base_url, **options)
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.timeout),
            headers=self.headers,
            transport=transport,
        )

    async def send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                return await self._once(call)
            except ClientError as error:
                wait = self.retry.wait(attempt, error)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            attempt += 1

    async def _once(self, call: Call[T]) -> T:
        try:
            response = await self.http.request(**_request(call))
        except httpx.TransportError as exc:
            raise Unreachable(f"{call.method} {self.base_url}{call.url}: {describe(exc)}") from exc
        return _answer(call, response)

    async def aclose(self) -> None:
        await self.http.aclose()
