"""``/docs``: Swagger UI, its script, style and icon served from here.

FastAPI's own page loads them from a CDN, which a server without internet access cannot
reach. The ``swagger-ui-bundle`` package ships Swagger UI 4, which refuses the OpenAPI 3.1
document FastAPI writes ("Unable to render this definition"); ``fastapi-offline`` ships
Swagger UI 5, and only its files are used here. ReDoc (FastAPI's ``/redoc``) is off: the
ReDoc 2 it ships always loads its logo from cdn.redoc.ly. The page answers without a key;
the document itself (``/openapi.json``) still asks for one while auth is on.
"""

from __future__ import annotations

import html
from importlib.resources import files
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from orchestratord.api.auth import OpenRoute
from orchestratord.ui.files import file_server, root

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}
TITLE = "orchestratord"


def _static() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link rel="stylesheet" href="{base}/docs/assets/swagger-ui.css">
<link rel="icon" href="{base}/docs/assets/favicon.png">
<title>{title} - Swagger UI</title>
</head>
<body data-openapi="{base}/openapi.json">
<div id="swagger-ui"></div>
<script src="{base}/docs/assets/swagger-ui-bundle.js"></script>
<script src="{base}/ui/static/docs.js"></script>
</body>
</html>
"""


async def swagger(request: Request) -> Response:
    """Swagger UI; ``ui/static/docs.js`` starts it, sending the dashboard's key (if any)."""
    base = html.escape(root(request), quote=True)
    return HTMLResponse(PAGE.format(base=base, title=TITLE))


ROUTES = [
    OpenRoute("/docs", swagger, name="docs"),
    OpenRoute("/docs/assets/{name}", file_server(_static, ASSETS), name="docs_asset"),
]
