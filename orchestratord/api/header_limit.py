"""Request headers within ``limits.max_headers`` (count) and ``limits.max_header_bytes``
(names and values together): 431 ``LIMIT_EXCEEDED`` past either, naming the limit, before
anything else reads them."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator_core.errors import TooLarge
from orchestratord.api.errors import error_response

HEADERS_TOO_LARGE = 431


class HeaderLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_headers: int, max_bytes: int) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            refused = None
            if len(headers) > self.max_headers:
                refused = TooLarge(
                    f"a request has at most {self.max_headers} headers, this one {len(headers)}",
                    limit="limits.max_headers",
                    value=self.max_headers,
                    field="headers",
                )
            elif (size := sum(len(k) + len(v) for k, v in headers)) > self.max_bytes:
                refused = TooLarge(
                    f"a request's headers are at most {self.max_bytes} bytes, these {size}",
                    limit="limits.max_header_bytes",
                    value=self.max_bytes,
                    field="headers",
                )
            if refused is not None:
                await error_response(HEADERS_TOO_LARGE, refused.body())(scope, receive, send)
                return
        await self.app(scope, receive, send)
