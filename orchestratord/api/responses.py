from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class JsonResponse(JSONResponse):
    """JSON by orjson. A ``JSONResponse`` to FastAPI, so the OpenAPI document shows each
    route's response model."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
