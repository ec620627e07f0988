"""The runs, replay, pools, step and docs pages in Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from orchestrator_client import AsyncClient
from orchestratord.runtime import Orchestrator
from test_harness.perturbed import PerturbedAdapter
from tests.helpers import read_stream
from tests.ui import calls
from tests.ui.conftest import screenshot

if TYPE_CHECKING:
    from playwright.async_api import Page, Route


async def test_runs_are_listed_filtered_and_kept_up_to_date(
    page: Page, api: httpx.AsyncClient, sdk: AsyncClient, server: str, artifacts: Path
) -> None:
    first = await calls.new_run(sdk)
    await calls.finished(sdk, await calls.start_step(sdk, first, n=4))
    await calls.complete(sdk, first)
    flow_id = (await api.get(f"/v1/runs/{first}")).json()["flow_id"]
    other = await calls.make_other_run(sdk)
    await page.goto(f"{server}/ui")
    await page.wait_for_selector(f'#runs tr[data-run-id="{first}"][data-status="succeeded"]')
    await page.wait_for_selector(f'#runs tr[data-run-id="{other}"][data-status="running"]')
    # live: a run made after the page was read appears
    later = await calls.new_run(sdk)
    await page.wait_for_selector(f'#runs tr[data-run-id="{later}"]')
    await screenshot(page, artifacts, "runs-page")
    await page.select_option("select[name=status]", "succeeded")
    await page.wait_for_url("**/ui?*status=succeeded*")
    await page.wait_for_selector(f'#runs tr[data-run-id="{first}"]')
    assert await page.locator("#runs tr").count() == 1
    await page.goto(f"{server}/ui")
    await page.fill("input[name=flow_id]", flow_id)
    await page.click("form.filters button")
    await page.wait_for_url(f"**/ui?flow_id={flow_id}*")
    await page.wait_for_selector(f'#runs tr[data-run-id="{first}"]')
    shown = await page.locator("#runs tr").evaluate_all("rs => rs.map(r => r.dataset.runId)")
    assert other not in shown and first in shown
    await page.click(f'#runs tr[data-run-id="{first}"] a >> nth=0')
    await page.wait_for_selector('body[data-page="run"][data-status="succeeded"]')


def _perturb(orch: Orchestrator, at: int) -> None:
    """The engine's token ``at`` changes (identity unchanged): a strict replay diverges."""
    replica = orch.pools.pools["local"].replicas[0]
    replica.adapter = PerturbedAdapter(replica.adapter, at=at)


async def test_a_diverged_strict_replay_shows_its_first_divergence(
    page: Page,
    api: httpx.AsyncClient,
    sdk: AsyncClient,
    server: str,
    orch: Orchestrator,
    artifacts: Path,
) -> None:
    source = await calls.new_run(sdk)
    recorded = await calls.finished(sdk, await calls.start_step(sdk, source, token="t0", n=12))
    _perturb(orch, at=4)
    strict = await calls.replay_of(sdk, source, "strict_replay")
    replayed = await calls.finished(sdk, await calls.start_step(sdk, strict, token="t0", n=12))
    assert replayed["status"] == "failed"
    await page.goto(f"{server}/ui/runs/{strict}/replay")
    first = page.locator("#first-divergence")
    await first.wait_for()
    assert await first.get_attribute("data-token-index") == "4"
    events = await read_stream(api, f"/v1/steps/{recorded['step_id']}/stream")
    tokens = [e.data["t"] for e in events if e.event == "token" and e.data]
    assert await first.locator(".tok.expected").text_content() == tokens[4]
    assert await first.locator(".tok.actual").text_content() == "PERTURBED "
    context = await first.locator(".tok.ctx").all_text_contents()
    assert context == tokens[:4] + tokens[5:10]
    assert "token 4" in await first.locator("h3").inner_text()
    assert await page.locator('tr[data-outcome="diverged"]').count() == 1
    await screenshot(page, artifacts, "replay-page")
    # the run page links to it
    await page.goto(f"{server}/ui/runs/{strict}")
    await page.click("text=replay report")
    await page.wait_for_selector("#first-divergence")


async def test_pools_show_replicas_load_and_breakers(
    page: Page, sdk: AsyncClient, server: str, orch: Orchestrator, artifacts: Path
) -> None:
    await page.goto(f"{server}/ui/pools")
    replica = page.locator('article[data-pool-id="local"] tr[data-replica-id="r0"]')
    await replica.wait_for()
    assert await replica.get_attribute("data-state") == "ready"
    assert "0 / 8" in await replica.inner_text()
    run_id = await calls.new_run(sdk)
    step_id = await calls.start_step(sdk, run_id, n=400)  # holds a slot for 20 s
    await page.wait_for_selector(
        'article[data-pool-id="local"] tr[data-replica-id="r0"] >> text="1 / 7"'
    )
    await screenshot(page, artifacts, "pools-page")
    await calls.cancel(sdk, step_id)
    await calls.finished(sdk, step_id)
    assert await replica.locator("td.breaker").get_attribute("data-breaker") == "closed"
    breakers = orch.services.engine_breakers  # calls to r0 fail: its breaker opens
    breaker = breakers.get(orch.pools.require("local").breaker_target("r0"))
    while not breakers.is_open(breaker.target):
        breaker.before_call().failure("engine down")
    await page.wait_for_selector(
        'article[data-pool-id="local"] tr[data-replica-id="r0"] td[data-breaker="open"]'
    )
    assert "failures" in await replica.locator("td.breaker").inner_text()


async def test_a_step_page_shows_provenance_and_placement(
    page: Page, sdk: AsyncClient, server: str, artifacts: Path
) -> None:
    run_id = await calls.new_run(sdk)
    step = await calls.finished(sdk, await calls.start_step(sdk, run_id, n=8))
    await page.goto(f"{server}/ui/steps/{step['step_id']}")
    await page.wait_for_selector('body[data-status="succeeded"]')
    await page.wait_for_function("() => document.querySelectorAll('.tokens .tok').length === 8")
    text = await page.inner_text("main")
    assert step["provenance"]["prompt_hash"] in text
    assert step["provenance"]["model_hash"] in text
    assert "most free slots" in text  # the placement's tie break
    assert "".join(await page.locator(".tokens .tok").all_text_contents()) == step["output"]["text"]
    await screenshot(page, artifacts, "step-page")


async def test_docs_render_with_no_other_host_reachable(
    page: Page, server: str, artifacts: Path
) -> None:
    host = urlsplit(server).netloc
    elsewhere: list[str] = []

    async def only_here(route: Route) -> None:
        if urlsplit(route.request.url).netloc == host:
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    await page.route("**/*", only_here)
    await page.goto(f"{server}/docs")
    await page.wait_for_selector(".opblock-tag-section")
    assert await page.locator(".opblock").count() > 20
    await screenshot(page, artifacts, "docs-swagger", full_page=False)
    assert elsewhere == []
