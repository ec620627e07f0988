"""``X-Correlation-Id`` on every response (echoed or generated) and in every log line."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestratord.api.asgi import header

HEADER = "x-correlation-id"
correlation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "correlation_id", default=None
)
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class CorrelationIdMiddleware:
    """Pure ASGI, so streaming responses pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = header(scope, b"x-correlation-id")
        candidate = None if given is None else given.decode("latin-1")
        cid = candidate if candidate is not None and _VALID.match(candidate) else str(uuid.uuid4())
        token = correlation_id.set(cid)
        raw = cid.encode()

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                started = True
                headers = [
                    h for h in message.get("headers", []) if h[0].lower() != b"x-correlation-id"
                ]
                headers.append((b"x-correlation-id", raw))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Answered here, not by Starlette's outer error middleware, so that the body and
            # the log line carry the correlation id.
            logging.getLogger("orchestratord.api").exception("unhandled error")
            if started:
                raise
            body = orjson.dumps(
                {
                    "code": "INTERNAL",
                    "message": "internal error; the correlation id locates it in the logs",
                    "retriable": True,
                    "retry_after_ms": None,
                    "details": {},
                    "correlation_id": cid,
                }
            )
            await send_with_id(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send_with_id({"type": "http.response.body", "body": body})
        finally:
            correlation_id.reset(token)


class CorrelationLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.correlation_id = correlation_id.get() or "-"
        return True
