"""Every call the browser tests make to set things up, in one place, through the SDK (as an
interpreter would start the steps the page shows). Each returns what the test needs."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator_client import AsyncClient, steps

TERMINAL = ("succeeded", "failed", "cancelled")


async def new_run(api: AsyncClient, **run: Any) -> str:
    """A record run (seed 42) of a new flow; ``run`` adds to its body."""
    flow = await api.create_flow({"ast": {"ui": "test"}})
    return (await api.create_run(flow.flow_id, {"seed": 42, **run})).run_id


async def start_step(
    api: AsyncClient, run_id: str, *, token: str = "s1", prompt: str = "hello", n: int = 40
) -> str:
    """An ``llm_call`` step of ``n`` tokens submitted; its id (it runs on its own)."""
    step = steps.llm_call(prompt, max_tokens=n, client_token=token)
    return (await api.submit_step(run_id, step)).step_id


async def finished(api: AsyncClient, step_id: str) -> dict[str, Any]:
    """The step's record once it has ended (a minute at most, however slow the machine)."""
    for _ in range(1200):
        record = await api.get_step(step_id)
        if record.status in TERMINAL:
            return record.model_dump(mode="json")
        await asyncio.sleep(0.05)
    raise AssertionError(f"step {step_id} is still {record.status}")


async def add_fact(api: AsyncClient, run_id: str, kind: str, data: Any) -> None:
    await api.add_fact(run_id, {"type": kind, "data": data})


async def complete(api: AsyncClient, run_id: str) -> None:
    await api.complete_run(run_id, "succeeded")


async def checkpoint(api: AsyncClient, run_id: str, state: dict[str, Any]) -> None:
    await api.checkpoint(run_id, {"state": state})


async def replay_of(api: AsyncClient, source_run_id: str, mode: str) -> str:
    """A ``replay`` or ``strict_replay`` run of ``source_run_id``'s flow."""
    flow_id = (await api.get_run(source_run_id)).flow_id
    body = {"mode": mode, "source_run_id": source_run_id}
    return (await api.create_run(flow_id, body)).run_id


async def cancel(api: AsyncClient, step_id: str) -> None:
    await api.cancel_step(step_id)


async def make_other_run(api: AsyncClient) -> str:
    """A run of a flow of its own."""
    flow = await api.create_flow({"ast": {"ui": "other"}})
    return (await api.create_run(flow.flow_id, {"seed": 42})).run_id
