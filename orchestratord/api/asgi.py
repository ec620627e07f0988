"""What the pure-ASGI parts of the API (middlewares, the hot routes) read off a request."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the request header ``name`` (lower case, as ASGI gives them)."""
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app ``body``, already read, then what ``receive`` gives
    (the client leaving)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
