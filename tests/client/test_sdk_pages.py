"""Listing everything through the SDK: ``iter_runs`` and ``iter_facts`` follow the ``after``
cursor page by page, so a dashboard or a job sees every record once, in the server's order."""

from __future__ import annotations

import asyncio

from orchestrator_client import AsyncClient, Client


async def test_every_run_and_fact_once_a_page_at_a_time(server_url: str) -> None:
    async with AsyncClient(server_url) as client:
        flow = await client.create_flow({"ast": {"program": "pages"}})
        made = [(await client.create_run(flow.flow_id, {"seed": n})).run_id for n in range(5)]
        other = await client.create_flow({"ast": {"program": "elsewhere"}})
        await client.create_run(other.flow_id)
        facts = [
            (await client.add_fact(made[0], {"type": "obs", "data": {"n": n}})).fact_id
            for n in range(5)
        ]
        await client.add_fact(made[0], {"type": "note", "data": {"n": -1}})
        runs = [r.run_id async for r in client.iter_runs(flow_id=flow.flow_id, page=2)]
        assert runs == made[::-1]  # newest first, each once across three pages
        got = [f.fact_id async for f in client.iter_facts(made[0], type="obs", page=2)]
        assert got == facts
        assert [r.run_id async for r in client.iter_runs(flow_id=flow.flow_id, page=5)] == runs

    def blocking() -> tuple[list[str], list[str]]:
        with Client(server_url) as sync:
            return (
                [r.run_id for r in sync.iter_runs(flow_id=flow.flow_id, page=3)],
                [f.fact_id for f in sync.iter_facts(made[0], type="obs", page=4)],
            )

    assert await asyncio.to_thread(blocking) == (made[::-1], facts)
