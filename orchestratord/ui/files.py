"""What the dashboard's and the docs' routes share: the files they serve, and the path the
app is mounted at."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from orchestrator_core.errors import NotFound

Endpoint = Callable[[Request], Awaitable[Response]]


def root(request: Request) -> str:
    """The path the app is mounted at (``root_path``), without a trailing ``/``."""
    mounted: str = request.scope.get("root_path", "")
    return mounted.rstrip("/")


def file_server(directory: Callable[[], Path], types: Mapping[str, str]) -> Endpoint:
    """An endpoint serving the files of ``directory`` that ``types`` names (by their name,
    with that media type); any other name is 404."""

    async def serve(request: Request) -> Response:
        name: str = request.path_params["name"]
        media_type = types.get(name)
        if media_type is None:
            raise NotFound("asset", name)
        # revalidated each time (ETag), so a new version of the server is picked up at once
        return FileResponse(
            directory() / name,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )

    return serve
