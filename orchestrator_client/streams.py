"""Following a step's or a run's SSE stream to its end, across dropped connections.

The server numbers every stored event (``id:``); after a drop the stream is opened again
with ``Last-Event-ID``, so the server sends what follows the last event read. An event whose
id is not past the last one read is skipped, so nothing is yielded twice even from a server
that resent it; events without an id (a queued step's position) are yielded as they come.
Reconnecting goes on while the server is unreachable (a restart) for up to ``give_up_s``
seconds of silence, waiting the ``retry:`` the server asked for or a doubling backoff.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, ParamSpec, overload

import httpx

from contracts.events import EventBase
from orchestrator_client.calls import filled
from orchestrator_client.errors import ApiError, Unreachable
from orchestrator_client.sse import SseParser, decode
from orchestrator_client.transport import AsyncTransport, describe

if TYPE_CHECKING:
    from orchestrator_client.transport import SyncTransport

P = ParamSpec("P")


@dataclass
class Follow:
    """Where a stream is: the last event id read, whether its end was seen, and how long to
    keep trying. Shared by the blocking and the async iterator (no I/O here)."""

    route: str
    path: dict[str, str]
    terminal: frozenset[str]
    last_event_id: str | None = None
    give_up_s: float = 60.0
    ended: bool = False
    _parser: SseParser = field(default_factory=SseParser)
    _delay_s: float = 0.1
    _silent_since: float | None = None

    @property
    def url(self) -> str:
        return filled(self.route, self.path)

    def opening(self) -> dict[str, str]:
        """Headers of the next request; a new parser (a partial event is not kept)."""
        self._parser = SseParser(last_event_id=self.last_event_id)
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def feed(self, line: str) -> EventBase | None:
        """The event a line completes, if any and not already read."""
        self._silent_since = None  # the server is talking: keep-alives count
        sse = self._parser.feed(line)
        if sse is None:
            return None
        if sse.id is not None:
            if self.last_event_id is not None and _after(self.last_event_id) >= _after(sse.id):
                return None  # read before the drop
            self.last_event_id = sse.id
        if sse.event in self.terminal:
            self.ended = True
        return decode(sse)

    def dropped(self, reason: str, base_url: str) -> float:
        """Seconds to wait before reconnecting; :class:`Unreachable` when it is time to stop."""
        now = time.monotonic()
        if self._silent_since is None:
            self._silent_since = now
            self._delay_s = 0.1
        elif now - self._silent_since > self.give_up_s:
            raise Unreachable(f"GET {base_url}{self.url}: {reason} (gave up resuming)")
        wait = self._delay_s
        if self._parser.retry_ms is not None:
            wait = max(wait, self._parser.retry_ms / 1000)
        self._delay_s = min(self._delay_s * 2, 5.0)
        return wait

    def refused(self, error: ApiError, base_url: str) -> float:
        """A refusal to open the stream: retriable ones wait as asked, others are raised."""
        if not error.retriable:
            raise error
        wait = self.dropped(error.message, base_url)
        return max(wait, error.retry_after_s or 0.0)


def _after(event_id: str) -> int:
    try:
        return int(event_id)
    except ValueError:
        return -1


class EventStream:
    """A blocking iterator of a stream's typed events; ``last_event_id`` is where it is."""

    def __init__(self, transport: SyncTransport, follow: Follow) -> None:
        self._transport = transport
        self.follow = follow

    @property
    def last_event_id(self) -> str | None:
        return self.follow.last_event_id

    def __iter__(self) -> Iterator[EventBase]:
        follow, http = self.follow, self._transport.http
        while not follow.ended:
            reason = "the stream closed before its end"
            try:
                with http.stream("GET", follow.url, headers=follow.opening()) as response:
                    if response.status_code != 200:
                        response.read()
                        raise ApiError.from_response(response)
                    for line in response.iter_lines():
                        event = follow.feed(line)
                        if event is not None:
                            yield event
                            if follow.ended:
                                return
            except httpx.TransportError as exc:
                reason = describe(exc)
            except ApiError as exc:
                time.sleep(follow.refused(exc, self._transport.base_url))
                continue
            time.sleep(follow.dropped(reason, self._transport.base_url))


class AsyncEventStream:
    """An async iterator of a stream's typed events; ``last_event_id`` is where it is."""

    def __init__(self, transport: AsyncTransport, follow: Follow) -> None:
        self._transport = transport
        self.follow = follow

    @property
    def last_event_id(self) -> str | None:
        return self.follow.last_event_id

    async def __aiter__(self) -> AsyncIterator[EventBase]:
        follow, http = self.follow, self._transport.http
        while not follow.ended:
            reason = "the stream closed before its end"
            try:
                async with http.stream("GET", follow.url, headers=follow.opening()) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise ApiError.from_response(response)
                    async for line in response.aiter_lines():
                        event = follow.feed(line)
                        if event is not None:
                            yield event
                            if follow.ended:
                                return
            except httpx.TransportError as exc:
                reason = describe(exc)
            except ApiError as exc:
                await asyncio.sleep(follow.refused(exc, self._transport.base_url))
                continue
            await asyncio.sleep(follow.dropped(reason, self._transport.base_url))


class StreamRoute(Generic[P]):
    """An SSE route of the API: read through a client, a method answering an iterator."""

    def __init__(self, route: str, terminal: frozenset[str], build: Callable[P, Start]):
        self.method = "GET"
        self.route = route
        self.terminal = terminal
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, client: None, owner: type[Any]) -> StreamRoute[P]: ...

    @overload
    def __get__(self, client: SyncTransport, owner: type[Any]) -> Callable[P, EventStream]: ...

    @overload
    def __get__(
        self, client: AsyncTransport, owner: type[Any]
    ) -> Callable[P, AsyncEventStream]: ...

    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self

        @functools.wraps(self.build)
        def bound(*args: Any, **kwargs: Any) -> Any:
            start = self.build(*args, **kwargs)
            follow = Follow(
                route=self.route,
                path=start.path,
                terminal=self.terminal,
                last_event_id=None if start.after is None else str(start.after),
                give_up_s=client.stream_give_up_s if start.give_up_s is None else start.give_up_s,
            )
            if isinstance(client, AsyncTransport):
                return AsyncEventStream(client, follow)
            return EventStream(client, follow)

        return bound


def stream_route(
    route: str, *, ends_on: frozenset[str]
) -> Callable[[Callable[P, Start]], StreamRoute[P]]:
    def make(build: Callable[P, Start]) -> StreamRoute[P]:
        return StreamRoute(route, ends_on, build)

    return make


class Start(NamedTuple):
    """What a stream route's build function says: the route's ids, the event to start
    after (None: the first), and how long a drop is retried (None: the client's)."""

    path: dict[str, str]
    after: str | int | None = None
    give_up_s: float | None = None
