"""The dashboard's pages and their assets.

Each page is one shell (``shell``) naming the page and the ids in its path. It loads two
scripts, in order: ``app.js``, what every page shares, and the page's own (``runs.js``,
``run.js``, ...), which renders it from the API. A shell holds no data, so it answers
without a key (:class:`~orchestratord.api.auth.OpenRoute`); every value put in it is
HTML-escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from orchestratord.api.auth import OpenRoute
from orchestratord.ui.files import file_server, root

STATIC = Path(__file__).parent / "static"
JS = "text/javascript; charset=utf-8"
# each page's own script, by the page's name: loaded after app.js, which they all share
PAGES = ("runs", "run", "replay", "step", "pools")
ASSETS = {
    "app.js": JS,
    **{f"{page}.js": JS for page in PAGES},
    "app.css": "text/css; charset=utf-8",
    "docs.js": JS,  # starts Swagger UI on /docs
}
# no script or style but the files above, and requests to this origin only: a value that
# slipped past escaping still could not run
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def shell(request: Request, page: str, title: str, **ids: str) -> HTMLResponse:
    """The HTML of one page: ``page`` and ``ids`` become ``data-`` attributes of its body,
    and it loads ``app.js`` and then ``page``'s own script."""
    if page not in PAGES:
        raise ValueError(f"no script for page {page!r}")
    base = escape(root(request), quote=True)
    data = "".join(
        f' data-{name.replace("_", "-")}="{escape(v, quote=True)}"' for name, v in ids.items()
    )
    html = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · orchestratord</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{base}/ui/static/app.css">
<script src="{base}/ui/static/app.js" defer></script>
<script src="{base}/ui/static/{page}.js" defer></script>
</head>
<body data-page="{escape(page, quote=True)}" data-base="{base}"{data}>
<header class="top">
<a class="brand" href="{base}/ui">orchestratord</a>
<nav>
<a href="{base}/ui">Runs</a><a href="{base}/ui/pools">Pools</a><a href="{base}/docs">API</a>
</nav>
<span id="live" class="live" hidden></span>
<button id="forget-key" type="button" class="link" hidden>Forget key</button>
</header>
<form id="key-form" class="key-form" hidden>
<label for="key-input">This server needs an API key with read scope.</label>
<input id="key-input" name="key" type="password" autocomplete="off" placeholder="ok_..." required>
<button type="submit">Use key</button>
<p id="key-message" class="muted"></p>
</form>
<main id="main"><p class="muted">Loading…</p></main>
<noscript>This dashboard needs JavaScript.</noscript>
</body>
</html>
"""
    return HTMLResponse(html, headers=HEADERS)


async def runs_page(request: Request) -> Response:
    return shell(request, "runs", "Runs")


async def run_page(request: Request) -> Response:
    run_id: str = request.path_params["run_id"]
    return shell(request, "run", f"Run {run_id}", run_id=run_id)


async def replay_page(request: Request) -> Response:
    run_id: str = request.path_params["run_id"]
    return shell(request, "replay", f"Replay of {run_id}", run_id=run_id)


async def step_page(request: Request) -> Response:
    step_id: str = request.path_params["step_id"]
    return shell(request, "step", f"Step {step_id}", step_id=step_id)


async def pools_page(request: Request) -> Response:
    return shell(request, "pools", "Pools")


async def to_runs(request: Request) -> Response:
    return RedirectResponse(f"{root(request)}/ui", status_code=308)


ROUTES = [
    OpenRoute("/ui", runs_page, name="ui_runs"),
    OpenRoute("/ui/", to_runs, name="ui_slash"),
    OpenRoute("/ui/runs/{run_id}", run_page, name="ui_run"),
    OpenRoute("/ui/runs/{run_id}/replay", replay_page, name="ui_replay"),
    OpenRoute("/ui/steps/{step_id}", step_page, name="ui_step"),
    OpenRoute("/ui/pools", pools_page, name="ui_pools"),
    OpenRoute("/ui/static/{name}", file_server(lambda: STATIC, ASSETS), name="ui_asset"),
]
