"""A server span per HTTP request while tracing is on (``orchestratord/tracing.py``).

Outside the correlation middleware, so it sees the final status (a 500 made there included)
and reads the correlation id from the response. A ``traceparent`` header continues the
caller's trace. With tracing off a request pays one call and one test.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestratord import tracing


class RequestSpanMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.ACTIVE is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _traced(self.app, scope, receive, send, tracing.ACTIVE.tracer)


async def _traced(app: ASGIApp, scope: Scope, receive: Receive, send: Send, tracer: Any) -> None:
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in (b"traceparent", b"tracestate")
    }
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    method = scope["method"]
    with tracer.start_as_current_span(
        method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "url.path": scope["path"]},
    ) as span:

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                for name, value in message.get("headers", []):
                    if name == b"x-correlation-id":
                        span.set_attribute("correlation_id", value.decode("latin-1"))
            await send(message)

        try:
            await app(scope, receive, send_traced)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route is not None:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
