"""A small HTTP/1.1 client for engines: an asyncio protocol around httptools' parser.

An engine adapter makes one request per generation and reads a stream of small chunks; a
general-purpose client spends far more on each than the bytes cost (httpx with httpcore and
h11: 0.83 ms of CPU per 1-token generation on the fake OpenAI engine, against 0.105 ms here;
measured with one client reading one engine over loopback: ``bench/engine_client.py``,
``BENCHMARKS.md``). What it does:

* a keep-alive pool per origin: at most ``connections`` open, more requests wait for one;
  the last one put back is used first; one that the engine closed while idle is dropped,
  and a request whose reused connection closed before any answer is sent once more on a new
  one (the engine closed it as the request went out, most likely unread);
* interim (1xx) responses skipped, a chunked body's trailers kept out of the headers, a
  header's value without the spaces around it, an HTTP/1.0 connection never kept;
* ``http`` and ``https``; bodies by ``Content-Length``, chunked, or ending at close;
* a connect timeout, and a read timeout on every wait for bytes;
* back-pressure: reading pauses while more than 256 KiB are read and not taken;
* a bound on what is parsed without progress: more than 64 KiB read with no end of the head
  and no body (an endless header, trailers) fails the response, since the parser joins a
  header's pieces by copying (quadratic in a long one); a body read whole
  (:meth:`Response.read`, :meth:`Http1Client.request`) is read up to a cap the caller gives;
* ``Retry-After`` read (:meth:`Response.retry_after_ms`), in seconds or as a date;
* a response closed before its end (a cancelled generation) closes its connection, so the
  engine sees the client leave and frees the slot.

An engine that the standard proxy variables send through a proxy (``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``: :func:`proxy_for`) is read by httpx
instead, which speaks to proxies (an absolute target for ``http``, a ``CONNECT`` tunnel for
``https``), behind the same interface, errors and results; whether a client goes through a
proxy is decided once, when it is made, so the direct path costs no more for it.
``tests/adapters/test_http1_vs_httpx.py`` reads the same bytes through this client and
through httpx and expects the same results, or the differences it lists (this parser is
stricter than h11 about framing and obsolete syntax).

Not: redirects, cookies, compression, HTTP/2, ``Expect: 100-continue``, ``HEAD``.
Errors are this module's: :class:`ConnectFailed`, :class:`TimedOut`, :class:`Broken`.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import email.utils
import logging
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import httptools
import httpx

log = logging.getLogger(__name__)

HIGH_WATER = 256 * 1024  # unread bytes past which the connection stops reading
LOW_WATER = 64 * 1024
# bytes read with no progress (no end of the head, no body, no end of the message): a head or
# trailers longer than this is refused before the parser's copying of it can cost
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1 << 20  # of a body read whole by request(), unless the caller says


class HttpError(Exception):
    """What went wrong talking to the engine; the message names the URL."""


class ConnectFailed(HttpError):
    """No connection: refused, unreachable, a failed TLS handshake."""


class TimedOut(HttpError):
    """No connection or no bytes within the timeout."""


class Broken(HttpError):
    """The connection ended, or carried what is not HTTP, before the response's end."""


def _expire(waiter: asyncio.Future[None], what: str) -> None:
    if not waiter.done():
        waiter.set_exception(TimedOut(what))


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the response being read on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.begin()

    def begin(self) -> None:
        """Ready for the next response."""
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.error: HttpError | None = None
        self.received = False
        self.unparsed = 0  # bytes fed since the parser last made progress
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        if self.paused and self.transport is not None:
            self.transport.resume_reading()
        self.paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have the methods without subclassing asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.unparsed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(Broken(f"the engine sent what is not an HTTP response ({exc})"))
            return
        if self.unparsed > MAX_HEAD_BYTES:
            self.fail(Broken(f"the engine sent over {MAX_HEAD_BYTES} bytes of head or trailers"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            if self.head_done and self._ends_at_close():
                self.complete = True
            else:
                self.error = Broken("the engine closed the connection before the response ended")
        self.wake()

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # after the head: a chunked body's trailer, not a header
            # the parser drops the spaces before a value, not those after it (RFC 9110 5.5)
            self.headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (103 Early Hints...): the final follows
            self.interim = True
            self.headers = []
            return
        self.status = status
        self.head_done = True
        self.unparsed = 0
        self.wake()

    def on_body(self, body: bytes) -> None:
        self.unparsed = 0
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self.wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            self.unparsed = 0
            return
        self.unparsed = 0
        self.complete = True
        # an HTTP/1.0 peer's "keep-alive" is not trusted (as httpx does not)
        self.keep_alive = (
            self.parser.should_keep_alive() and self.parser.get_http_version() != "1.0"
        )
        self.wake()

    # for the client

    def _ends_at_close(self) -> bool:
        """Whether the body is what comes until the engine closes: no length, and no transfer
        coding ending in chunked (RFC 9112 6.3)."""
        codings = b""
        for name, value in self.headers:
            if name == b"content-length":
                return False
            if name == b"transfer-encoding":
                codings = value
        return not codings.rstrip().lower().endswith(b"chunked")

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: HttpError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.close()
        self.wake()

    def close(self) -> None:
        if not self.complete and self.error is None:  # not the end of a body ending at close
            self.error = Broken("the connection was closed by this client")
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    async def wait(self, timeout_s: float, what: str) -> None:
        """Until the protocol has news (bytes, the head, the end, an error), or TimedOut."""
        waiter = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout_s, _expire, waiter, what)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None


class Response(abc.ABC):
    """A response whose head has arrived; its body is read with :meth:`chunks`. Read from the
    engine directly, or through httpx when a proxy stands between (the two subclasses)."""

    url: str
    status: int
    headers: list[tuple[bytes, bytes]]  # names in lower case, in the order received

    def header(self, name: str) -> str | None:
        key = name.lower().encode("latin-1")
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    @abc.abstractmethod
    def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive (chunked encoding already removed)."""

    async def read(self, limit: int | None = None) -> bytes:
        """The body, or its first ``limit`` bytes: reading stops there (the rest is never
        read, and the connection is not kept)."""
        if limit is None:
            return b"".join([chunk async for chunk in self.chunks()])
        parts: list[bytes] = []
        left = limit
        async with contextlib.aclosing(self.chunks()) as body:
            async for chunk in body:
                parts.append(chunk[:left])
                left -= len(parts[-1])
                if left <= 0:
                    self.close()
                    break
        return b"".join(parts)

    def retry_after_ms(self) -> int | None:
        """The ``Retry-After`` header in milliseconds (seconds or an HTTP date, RFC 9110
        10.2.3), None when absent or unreadable; a date past is 0."""
        value = (self.header("retry-after") or "").strip()
        if value.isdigit():
            return int(value) * 1000
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0, round((when.timestamp() - time.time()) * 1000))

    @abc.abstractmethod
    def close(self) -> None:
        """Stop reading: a response not read to its end takes its connection with it, so the
        engine sees the client leave. Safe from any task, and more than once."""


class _DirectResponse(Response):
    def __init__(self, conn: _Connection, url: str, timeout_s: float) -> None:
        self._conn = conn
        self.url = url
        self.status = conn.status
        self.headers = conn.headers
        self._timeout_s = timeout_s
        self._closed = False

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.error is not None:
                raise type(conn.error)(f"{self.url}: {conn.error}")
            elif conn.complete:
                return
            else:
                await conn.wait(self._timeout_s, f"{self.url}: no bytes in {self._timeout_s:g} s")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._conn.complete:
            self._conn.fail(Broken("the response was closed"))

    @property
    def reusable(self) -> bool:
        c = self._conn
        return c.complete and c.keep_alive and not c.closed and c.error is None


def proxy_for(url: str) -> str | None:
    """The forward proxy that the standard variables name for ``url`` (``HTTP_PROXY``,
    ``HTTPS_PROXY``, ``ALL_PROXY``, in either case, unless ``NO_PROXY`` names its host), or
    None. Read through the standard library, as urllib, httpx and curl read them."""
    # Not a setting: the only environment read outside orchestratord/settings.py. These
    # variables are the platform's convention for every HTTP client on the host, and an
    # operator behind a corporate proxy expects them honoured as every other client does.
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.netloc.rpartition("@")[2]):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


class _ProxiedResponse(Response):
    """A response read by httpx through a proxy."""

    def __init__(self, raw: httpx.Response, url: str, timeout_s: float) -> None:
        self._raw = raw
        self.url = url
        self.status = raw.status_code
        self.headers = [(k.lower(), v) for k, v in raw.headers.raw]
        self._timeout_s = timeout_s
        self._body = raw.aiter_raw()
        self._reader: asyncio.Task[Any] | None = None  # the task waiting for bytes, if any
        self._closing: asyncio.Task[None] | None = None
        self._complete = self._closed = self._interrupted = False

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        while not self._complete:
            if self._closed:
                raise Broken(f"{self.url}: the response was closed")
            reader = self._reader = asyncio.current_task()
            try:
                chunk = await anext(self._body)
            except StopAsyncIteration:
                self._complete = True
                return
            except asyncio.CancelledError:
                # cancelled by close() alone: the end of this response, not of the task
                if self._interrupted and reader is not None and reader.uncancel() == 0:
                    raise Broken(f"{self.url}: the response was closed") from None
                raise
            except httpx.HTTPError as exc:
                raise _translated(exc, self.url, self._timeout_s, head=False) from exc
            finally:
                self._reader = None
            yield chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete:
            return
        if self._reader is not None:
            # httpx closes a connection whose response was cut short by a cancellation
            self._interrupted = True
            self._reader.cancel()
        else:
            self._closing = asyncio.get_running_loop().create_task(_close_quietly(self._raw))

    async def aclose(self) -> None:
        """At the end of the request's block: the connection back to the pool if the body
        was read to its end, closed otherwise."""
        self._closed = True
        await (self._closing or _close_quietly(self._raw))


async def _close_quietly(raw: httpx.Response) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the connection is dropped: nothing to read
        await raw.aclose()


def _translated(exc: httpx.HTTPError, url: str, timeout_s: float, *, head: bool) -> HttpError:
    """httpx's error as this module's, as the direct path would have raised it."""
    why = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.PoolTimeout):
        return TimedOut(f"{url}: no connection free in {timeout_s:g} s")
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(f"{url}: no {'answer' if head else 'bytes'} in {timeout_s:g} s")
    if isinstance(exc, httpx.ConnectError | httpx.ProxyError):  # not the proxy's URL: secrets
        return ConnectFailed(f"cannot connect to {url} through the proxy: {why}")
    return Broken(f"{url}: {why}")


class _Proxied:
    """Requests to one origin through a forward proxy, made by httpx."""

    def __init__(
        self,
        proxy: str,
        origin: str,
        headers: dict[str, str],
        ssl_context: ssl.SSLContext | None,
        connect_timeout_s: float,
        read_timeout_s: float,
        connections: int,
    ) -> None:
        self._origin = origin
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._client = httpx.AsyncClient(
            proxy=proxy,
            # this module has already read the environment (proxy_for): httpx must not read
            # it again, nor its CA variables, so both paths trust the same authorities
            trust_env=False,
            verify=ssl_context if ssl_context is not None else True,
            headers=headers,
            cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),  # none kept, as direct
            timeout=self._timeout,
            limits=httpx.Limits(
                max_connections=connections,
                max_keepalive_connections=connections,
                keepalive_expiry=None,
            ),
        )
        del self._client.headers["accept-encoding"]  # bodies as the engine sends them

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        target: str,
        url: str,
        body: bytes | None,
        content_type: str,
        timeout_s: float,
    ) -> AsyncIterator[Response]:
        if self._client.is_closed:
            raise ConnectFailed(f"{url}: the client is closed")
        timeout = (
            self._timeout
            if timeout_s == self._read_timeout_s
            else httpx.Timeout(timeout_s, connect=self._connect_timeout_s)
        )
        request = self._client.build_request(
            method,
            self._origin + target,
            content=body,
            headers=None if body is None else {"content-type": content_type},
            timeout=timeout,
        )
        try:
            raw = await self._client.send(request, stream=True)
        except httpx.ConnectTimeout as exc:
            raise TimedOut(f"{url}: no connection in {self._connect_timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise _translated(exc, url, timeout_s, head=True) from exc
        response = _ProxiedResponse(raw, url, timeout_s)
        try:
            yield response
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


class Http1Client:
    """Requests to one origin (``base_url``'s scheme, host and port), paths under its path."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        connections: int = 64,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``base_url``'s path is :attr:`prefix`, for the caller to put before its paths; its
        query is added to every request's; its user and password, if any, are sent as Basic
        credentials unless ``headers`` has an ``Authorization``. ``ssl_context`` verifies an
        ``https`` engine (default: the system's CAs)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # not quoted: the URL may carry credentials
            raise ValueError(
                f"base_url must be an http:// or https:// URL (scheme {parts.scheme!r})"
            )
        self.prefix = parts.path.rstrip("/")
        self._query = parts.query
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.netloc.rpartition("@")[2]
        self._origin = f"{parts.scheme}://{host}"  # for messages: no credentials, no query
        self._ssl = None
        if parts.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        fixed = {
            "host": host,
            "user-agent": "orchestratord",
            "accept": "*/*",
            **{k.lower(): v for k, v in (headers or {}).items()},
        }
        if parts.username is not None and "authorization" not in fixed:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            fixed["authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        for name, value in fixed.items():
            if any(c in name + value for c in "\r\n"):
                raise ValueError(f"header {name!r}: line breaks are not allowed")
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        proxy = proxy_for(base_url)
        self._proxied: _Proxied | None = None
        if proxy is not None:  # decided once: a client goes through a proxy, or never does
            log.info("requests to %s go through the proxy the environment names", self._origin)
            self._proxied = _Proxied(
                proxy,
                f"{parts.scheme}://{host}",
                {k: v for k, v in fixed.items() if k != "host"},
                self._ssl,
                connect_timeout_s,
                read_timeout_s,
                connections,
            )
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._closed = False

    def url(self, path: str) -> str:
        return f"{self._origin}{path}"

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> AsyncIterator[Response]:
        """``path`` is the whole path (``client.prefix`` + the endpoint's). The response is
        closed, and its connection kept or dropped, when the block ends."""
        if method == "HEAD":  # its response's length describes a body that never comes
            raise ValueError("HEAD is not supported")
        timeout = self.read_timeout_s if timeout_s is None else timeout_s
        url = self.url(path)
        if self._query:
            path += ("&" if "?" in path else "?") + self._query
        if self._proxied is not None:
            async with self._proxied.stream(
                method, path, url, body, content_type, timeout
            ) as response:
                log.debug("%s %s -> %d (through the proxy)", method, url, response.status)
                yield response
            return
        if self._slots.locked():
            try:
                async with asyncio.timeout(timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise TimedOut(f"{url}: no connection free in {timeout:g} s") from None
        else:
            await self._slots.acquire()
        try:
            head = b"%s %s HTTP/1.1\r\n%s" % (method.encode(), path.encode(), self._fixed)
            if body is not None:
                head += b"content-type: %s\r\ncontent-length: %d\r\n" % (
                    content_type.encode("latin-1"),
                    len(body),
                )
            request = head + b"\r\n" + (body or b"")
            response = await self._send(request, url, timeout)
            log.debug("%s %s -> %d", method, url, response.status)
            try:
                yield response
            finally:
                response.close()
                self._release(response)
        finally:
            self._slots.release()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        timeout_s: float | None = None,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> tuple[int, bytes]:
        """A response: its status and its body's first ``max_bytes`` bytes."""
        async with self.stream(method, path, body=body, timeout_s=timeout_s) as response:
            return response.status, await response.read(max_bytes)

    async def _send(self, request: bytes, url: str, timeout_s: float) -> _DirectResponse:
        for attempt in (1, 2):
            conn, reused = await self._connection(url)
            if reused:  # a new one is ready, and may already hold what the engine sent first
                conn.begin()
            try:
                if not conn.closed and conn.transport is not None:
                    try:
                        conn.transport.write(request)
                    except (OSError, RuntimeError) as exc:  # uvloop: its handle just closed
                        conn.fail(Broken(f"the request could not be sent ({exc})"))
                while not conn.head_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(timeout_s, f"{url}: no answer in {timeout_s:g} s")
            except Broken as exc:
                self._drop(conn)
                if reused and not conn.received and attempt == 1:
                    # the engine closed it as it sat idle, as the request went out: sent once
                    # more on a new connection (had the engine read it and then died without
                    # a byte, a generation runs twice; only one answer is read)
                    continue
                raise Broken(f"{url}: {exc}") from None
            except BaseException:
                self._drop(conn)
                raise
            return _DirectResponse(conn, url, timeout_s)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self, url: str) -> tuple[_Connection, bool]:
        if self._closed:
            raise ConnectFailed(f"{url}: the client is closed")
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
            self._drop(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise TimedOut(f"{url}: no connection in {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {url}: {exc}") from exc
        self._all.add(conn)
        return conn, False

    def _release(self, response: _DirectResponse) -> None:
        conn = response._conn
        if response.reusable and not self._closed:
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def aclose(self) -> None:
        self._closed = True
        if self._proxied is not None:
            await self._proxied.aclose()
        for conn in list(self._all):
            self._drop(conn)
        self._idle.clear()
