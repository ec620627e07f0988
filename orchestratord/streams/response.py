"""The ``text/event-stream`` response of the stream routes: one task besides the request's.

The follower (``streams/sse.py``) yields every byte to send, keep-alive comments included,
so nothing else needs a timer; the request's own task sends them. One watcher task waits for
the client to leave (``http.disconnect``) and cancels the sender, whose generator then runs
its ``finally`` (unsubscribe, cancel on disconnect). A general-purpose SSE response runs a
ping task, a disconnect task and a shutdown watcher per stream under a task group: at
10,000 idle streams that is the difference between fitting a memory budget and not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import cast

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

# the server's ``send``, put in the scope by the app (``api/app.py``): every middleware here
# looks at a response's start only (its status, its headers), so a stream's frames, a
# keep-alive every 15 s on each idle stream, skip their wrappers
RAW_SEND = "orchestratord.raw_send"

_RAW_HEADERS: dict[tuple[tuple[str, str], ...], tuple[tuple[bytes, bytes], ...]] = {}


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        headers: Mapping[str, str],
        status_code: int = 200,  # the signature FastAPI reads for the OpenAPI document
        own_headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers`` are shared by many streams (encoded once); ``own_headers`` are this
        response's alone (a submission's step id, its run's budget)."""
        self.frames = frames
        self.status_code = status_code
        self.background = None
        key = tuple(headers.items())
        raw = _RAW_HEADERS.get(key)
        if raw is None:  # every stream answers with the same headers: encoded once, shared
            self.init_headers({**headers, "content-type": "text/event-stream; charset=utf-8"})
            raw = _RAW_HEADERS[key] = tuple(self.raw_headers)
        if own_headers:
            raw = raw + tuple(
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in own_headers.items()
            )
        # a tuple: what would change one response's headers fails instead of changing all
        self.raw_headers = cast(list[tuple[bytes, bytes]], raw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.current_task()
        assert sender is not None
        left = False

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            sender.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            send = scope.get(RAW_SEND, send)
            async for chunk in self.frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from elsewhere (shutdown): not the client leaving
            sender.uncancel()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
