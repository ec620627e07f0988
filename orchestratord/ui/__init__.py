"""The dashboard at ``/ui`` and the API docs at ``/docs``, served with their assets.

Page shells are HTML with no data in them; ``static/app.js`` and the page's own script
(``static/runs.js``, ``run.js``, ...) fill them from the JSON API and its streams, sending
the key the page asks for when the API answers 401 (``docs/ui.md``).
Nothing is fetched from another host: the docs' Swagger UI comes from a package.
"""

from __future__ import annotations

from typing import Any

from orchestratord.ui import docs, routes


def install(app: Any) -> None:
    """Add the dashboard's and the docs' routes to ``app`` (none in the OpenAPI document)."""
    app.router.routes.extend([*routes.ROUTES, *docs.ROUTES])
