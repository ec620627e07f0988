"""Request bodies up to ``limits.max_body_bytes``: 413 ``LIMIT_EXCEEDED`` past it.

A declared ``Content-Length`` over the limit is refused before a byte is read; a body sent
without one (chunked) is read here and refused as soon as it passes the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator_core.errors import TooLarge
from orchestratord.api.asgi import replay
from orchestratord.api.errors import error_response, status_of


def _too_large(limit: int) -> TooLarge:
    return TooLarge(
        f"a request body is at most {limit} bytes",
        limit="limits.max_body_bytes",
        value=limit,
        field="body",
    )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"transfer-encoding":  # chunked: a Content-Length beside it means nothing
                declared = None
                break
            if name == b"content-length":
                declared = value
        if declared is not None:
            # the server reads no more than declared, so the declaration is the size
            if declared.isdigit() and int(declared) > limit:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # chunked: read it here (it would be read whole anyway), then hand it on
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        exc = _too_large(self.max_bytes)
        await error_response(status_of(exc), exc.body())(scope, receive, send)
