"""Every call the browser tests make to set things up, in one place (the SDK is to replace
httpx here). Each returns the ids the test needs."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.helpers import make_flow, make_run, submit

TERMINAL = ("succeeded", "failed", "cancelled")


async def new_run(api: httpx.AsyncClient, **run: Any) -> str:
    """A record run (seed 42) of a new flow; ``run`` adds to its body."""
    return await make_run(api, await make_flow(api, {"ui": "test"}), **run)


async def start_step(
    api: httpx.AsyncClient, run_id: str, *, token: str = "s1", prompt: str = "hello", n: int = 40
) -> str:
    """An ``llm_call`` step of ``n`` tokens submitted; its id (it runs on its own)."""
    r = await submit(api, run_id, token, prompt, max_tokens=n)
    assert r.status_code in (200, 202), r.text
    step_id: str = r.json()["step_id"]
    return step_id


async def finished(api: httpx.AsyncClient, step_id: str) -> dict[str, Any]:
    """The step's record once it has ended (a minute at most, however slow the machine)."""
    for _ in range(1200):
        record: dict[str, Any] = (await api.get(f"/v1/steps/{step_id}")).json()
        if record["status"] in TERMINAL:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"step {step_id} is still {record['status']}")


async def add_fact(api: httpx.AsyncClient, run_id: str, kind: str, data: Any) -> None:
    r = await api.post(f"/v1/runs/{run_id}/facts", json={"type": kind, "data": data})
    assert r.status_code in (200, 201), r.text


async def complete(api: httpx.AsyncClient, run_id: str) -> None:
    r = await api.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    assert r.status_code == 200, r.text


async def checkpoint(api: httpx.AsyncClient, run_id: str, state: dict[str, Any]) -> None:
    r = await api.post(f"/v1/runs/{run_id}/checkpoint", json={"state": state})
    assert r.status_code in (200, 201), r.text


async def replay_of(api: httpx.AsyncClient, source_run_id: str, mode: str) -> str:
    """A ``replay`` or ``strict_replay`` run of ``source_run_id``'s flow."""
    flow_id = (await api.get(f"/v1/runs/{source_run_id}")).json()["flow_id"]
    r = await api.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source_run_id}
    )
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


async def cancel(api: httpx.AsyncClient, step_id: str) -> None:
    r = await api.post(f"/v1/steps/{step_id}/cancel")
    assert r.status_code in (200, 202), r.text


async def make_other_run(api: httpx.AsyncClient) -> str:
    """A run of a flow of its own."""
    return await make_run(api, await make_flow(api, {"ui": "other"}))
