"""What the server answers for the dashboard and the docs, without a browser."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from orchestrator_core.keys import Scope
from orchestratord.auth import store
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from tests.conftest import make_settings

PAGES = ["/ui", "/ui/runs/run_x", "/ui/runs/run_x/replay", "/ui/steps/step_x", "/ui/pools"]
ASSETS = {
    "/ui/static/app.js": "text/javascript",
    "/ui/static/app.css": "text/css",
}


_SCRIPT_URL = r"['\"](https?://[^'\"]+|/[a-z][^'\"\s]*\.(?:js|css|png|json))['\"]"


class _Refs(HTMLParser):
    """Every URL a page loads or links to: src, href, url(...) and URLs in its scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data: str) -> None:
        self.urls += re.findall(r"url\(['\"]?([^'\")]+)", data)
        # a page script's own requests (Swagger UI's document URL)
        self.urls += re.findall(_SCRIPT_URL, data)


def _refs(html: str) -> list[str]:
    parser = _Refs()
    parser.feed(html)
    return parser.urls


async def test_pages_and_assets_are_served(api: httpx.AsyncClient) -> None:
    for path in PAGES:
        r = await api.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert '<script src="/ui/static/app.js" defer></script>' in r.text
    for path, kind in ASSETS.items():
        r = await api.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith(kind)
        assert len(r.content) > 1000
    assert (await api.get("/ui/static/nothing.js")).status_code == 404
    assert (await api.get("/ui/static/..%2Froutes.py")).status_code == 404
    r = await api.get("/ui/", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/ui"


async def test_ids_in_a_page_are_escaped(api: httpx.AsyncClient) -> None:
    r = await api.get('/ui/runs/"><img src=x onerror=alert(1)>')
    assert r.status_code == 200
    assert "<img" not in r.text
    assert 'data-run-id="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text


async def test_the_ui_is_not_in_the_openapi_document(api: httpx.AsyncClient) -> None:
    paths = (await api.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith(("/ui", "/docs", "/redoc"))]


async def test_docs_load_nothing_from_another_host(api: httpx.AsyncClient) -> None:
    path = "/docs"
    r = await api.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    refs = _refs(r.text)
    assert refs, r.text
    base = str(api.base_url)
    for ref in refs:
        url = urljoin(base + path, ref)
        assert urlsplit(url).netloc == urlsplit(base).netloc, f"{path} loads {ref}"
        asset = await api.get(url)
        assert asset.status_code == 200, ref
        kind = asset.headers["content-type"]
        if ref.endswith(".js"):
            assert kind.startswith("text/javascript"), (ref, kind)
        elif ref.endswith(".css"):
            assert kind.startswith("text/css"), (ref, kind)
        elif ref.endswith(".png"):
            assert kind == "image/png", (ref, kind)
        elif ref.endswith(".json"):
            assert kind.startswith("application/json"), (ref, kind)
    assert "cdn." not in r.text and "fonts.googleapis" not in r.text


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, auth={"cache_s": 0, "max_failures_per_minute": 0})


async def test_with_auth_on_only_pages_and_assets_answer_without_a_key(
    api: httpx.AsyncClient, orch: Orchestrator
) -> None:
    async with orch.db.write() as session:
        await store.create(session, scope=Scope.READ, name="ui")
    open_paths = [*PAGES, *ASSETS, "/docs", "/docs/assets/swagger-ui-bundle.js"]
    for path in open_paths:
        r = await api.get(path)
        assert r.status_code == 200, (path, r.status_code)
    closed = [
        "/v1/runs",
        "/v1/pools",
        "/openapi.json",
        "/ui/runs/run_x/steps",
        "/ui/other",
        "/uix",
        "/docsx",
        "/docs/assets",
        "/redoc",
    ]
    for path in closed:
        r = await api.get(path)
        assert r.status_code == 401, (path, r.status_code)
        assert r.json()["code"] == "UNAUTHENTICATED"
    r = await api.post("/ui", json={})
    assert r.status_code == 401
