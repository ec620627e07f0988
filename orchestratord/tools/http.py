"""HTTP tools: a POST of the args as JSON; the JSON reply is the result.

Before each attempt the tool's host is resolved once and every address checked
(``orchestrator_core.outbound``: no loopback, private, link-local, multicast, metadata...
unless ``tools.allow_hosts`` allows it); the request then goes to the address that was
checked (its ``Host`` header and TLS server name are the tool's host), so a name that
resolves elsewhere a moment later (DNS rebinding) changes nothing. A refused host and a
connection that fails answer the same error: a caller cannot tell a blocked address, a
closed port and a filtered one apart (the refusal's reason is in the log).

One pooled ``httpx.AsyncClient`` serves every call, so connections to a tool are reused.
The reply is read as a stream and dropped as soon as it passes the size cap. A call never
outlives its deadline (the step's wall budget), retries and backoff included; retries are
made only for tools marked idempotent, and only for failures a retry can fix.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import random
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from orchestrator_core.outbound import AllowList, refused
from orchestratord.tools.errors import ToolFailure

log = logging.getLogger(__name__)
UNREACHABLE = "could not connect to the tool's host"


@dataclass(frozen=True)
class HttpToolSettings:
    default_timeout_ms: int = 10000
    max_reply_bytes: int = 1_048_576
    max_retries: int = 2
    backoff_s: float = 0.1  # before the first retry; doubles for each next one
    max_connections: int = 64
    # hosts and networks allowed beyond the public ones
    allow: AllowList = field(default_factory=AllowList)


_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_BACKOFF_CAP_S = 5.0
# An error reply is read only far enough to quote it: its size is no reason to hide its status.
_ERROR_EXCERPT_BYTES = 512


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (the CA bundle, SSL_CERT_FILE/DIR honoured), made once per
    process: reading the bundle costs about 50 ms, which each executor paid at its start."""
    return httpx.create_ssl_context()


class HttpToolExecutor:
    def __init__(self, settings: HttpToolSettings) -> None:
        self.settings = settings
        self.client = httpx.AsyncClient(
            verify=_tls(),
            limits=httpx.Limits(
                max_connections=settings.max_connections,
                max_keepalive_connections=settings.max_connections,
            ),
            headers={"content-type": "application/json", "accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def post(
        self,
        url: str,
        args: dict[str, Any],
        *,
        timeout_ms: int | None,
        deadline_s: float | None,
        idempotent: bool,
        max_retries: int | None,
        max_reply_bytes: int | None,
        idempotency_key: str,
        on_retry: Callable[[int, str], None] | None = None,
    ) -> Any:
        """The tool's JSON reply; any failure is a :class:`ToolFailure`.

        ``on_retry(attempt, why)`` is told of each failed attempt that will be retried,
        before the backoff sleep.
        """
        settings = self.settings
        body = orjson.dumps(args)
        cap = max_reply_bytes or settings.max_reply_bytes
        per_attempt_s = (timeout_ms or settings.default_timeout_ms) / 1000
        retries = (
            (settings.max_retries if max_retries is None else max_retries) if idempotent else 0
        )
        # The loop's clock, not the process clock: the loop's timers are what end a wait, and
        # a frozen test clock must not stretch a real call past its budget.
        loop = asyncio.get_running_loop()
        ends_at = None if deadline_s is None else loop.time() + deadline_s
        attempt = 0
        try:
            # The outer bound is the guarantee; the checks inside only fail sooner and clearer.
            async with asyncio.timeout_at(ends_at):
                while True:
                    timeout = per_attempt_s
                    if ends_at is not None:
                        timeout = min(timeout, ends_at - loop.time())
                        if timeout <= 0:
                            raise ToolFailure(
                                "timeout", "the step's deadline passed", attempts=attempt
                            )
                    attempt += 1
                    try:
                        return await self._once(url, body, timeout, cap, idempotency_key)
                    except ToolFailure as failure:
                        failure.attempts = attempt
                        if attempt > retries or not failure.retriable:
                            raise
                        delay = min(
                            _BACKOFF_CAP_S,
                            settings.backoff_s * 2 ** (attempt - 1) * (1 + random.random() * 0.1),
                        )  # the jitter spreads out retries of many steps failing together
                        if ends_at is not None and loop.time() + delay >= ends_at:
                            raise  # a retry could not finish in time: the real failure says more
                        if on_retry is not None:
                            on_retry(attempt, failure.message)
                        await asyncio.sleep(delay)
        except TimeoutError as exc:
            raise ToolFailure(
                "timeout",
                "the step's deadline passed",
                attempts=max(attempt, 1),
                retriable=True,
            ) from exc

    async def _once(
        self, url: str, body: bytes, timeout_s: float, cap: int, idempotency_key: str
    ) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                request = self.client.build_request(
                    "POST",
                    url,
                    content=body,
                    headers={"idempotency-key": idempotency_key},
                    timeout=timeout_s,
                )
                await self._pin(request)
                response = await self.client.send(request, stream=True)
                try:
                    if response.is_success:
                        data = await _read(response, cap)
                    else:
                        data = await _excerpt(response)
                finally:
                    await response.aclose()
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ToolFailure(
                "timeout", f"no reply within {round(timeout_s * 1000)} ms", retriable=True
            ) from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ToolFailure("connect", f"bad tool URL {url!r}: {exc}") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # one answer for a closed port, a filtered one and a refused address
            raise ToolFailure("connect", UNREACHABLE, retriable=True) from exc
        except httpx.TransportError as exc:
            raise ToolFailure("connect", f"{type(exc).__name__}: {exc}", retriable=True) from exc
        except httpx.DecodingError as exc:  # a Content-Encoding the body does not match
            raise ToolFailure("invalid_json", f"the reply could not be decoded: {exc}") from exc
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise ToolFailure("connect", f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if not response.is_success:
            raise ToolFailure(
                "status",
                f"HTTP {status}: {data.decode('utf-8', 'replace')}",
                status=status,
                retriable=status in _RETRY_STATUS,
            )
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ToolFailure("invalid_json", f"the reply is not JSON: {exc}") from exc

    async def _pin(self, request: httpx.Request) -> None:
        """Resolve the request's host, check every address, and send the request to the
        first one, the host kept in ``Host`` and as the TLS server name; a refused host is
        ``httpx.ConnectError`` (what a failed connection raises)."""
        url = request.url
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host!r}", request=request) from exc
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]
        reason = refused(host, addresses, self.settings.allow)
        if reason is not None:
            log.warning("tool call to %s refused: a %s address (tools.allow_hosts)", host, reason)
            raise httpx.ConnectError(f"{host!r} is not reachable", request=request)
        if not addresses:
            raise httpx.ConnectError(f"cannot resolve {host!r}", request=request)
        ip = str(addresses[0])  # httpx writes an IPv6 host in brackets itself
        if ip != host:
            # its Host header stays the tool's host: the request was built from its URL
            request.url = url.copy_with(host=ip)
            if url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": host}


async def _read(response: httpx.Response, cap: int) -> bytes:
    length = response.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise ToolFailure("too_large", f"the reply is {length} bytes, over {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise ToolFailure("too_large", f"the reply passed {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _excerpt(response: httpx.Response) -> bytes:
    got = b""
    async for chunk in response.aiter_bytes():
        got += chunk
        if len(got) >= _ERROR_EXCERPT_BYTES:
            return got[:_ERROR_EXCERPT_BYTES] + b"..."
    return got
