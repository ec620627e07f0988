"""llm_plan on the real local model: constrained decoding gives a plan that parses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, read_stream, wait_status

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "name": "add",
        "description": "add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "executor": {"kind": "builtin", "name": "echo"},
    },
    {
        "name": "echo",
        "description": "say a text back",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        "executor": {"kind": "builtin", "name": "echo"},
    },
]


@pytest.fixture(scope="module")
def settings_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-plan") / "db.sqlite"


@pytest.fixture
async def client(gguf: Path, settings_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(f"sqlite:///{settings_path}", engine="llama", llama_model_path=gguf)
    orch = Orchestrator(settings)
    await orch.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=300) as c:
            yield c
    finally:
        await orch.stop()


async def test_the_real_model_plans_json_that_parses(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client, tools=TOOLS)
    for seed in (1, 2):
        run_id = await make_run(client, flow_id, seed=seed)
        r = await client.post(
            f"/v1/runs/{run_id}/steps",
            json={
                "type": "llm_plan",
                "client_token": "p",
                "input": {
                    "prompt": "Add 2 and 3.",
                    "tools": ["add", "echo"],
                    "params": {"max_tokens": 160, "temperature": 0.8},
                },
            },
        )
        assert r.status_code == 202, r.text
        step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
        assert step["status"] == "succeeded", step
        assert step["output"]["stop_reason"] == "eos", step["output"]
        plan = json.loads(step["output"]["text"])  # the grammar held: it parses
        assert isinstance(plan["calls"], list) and plan["calls"]
        suggestions = step["output"]["suggestions"]
        assert [s["tool"] for s in suggestions] == [c["tool"] for c in plan["calls"]]
        assert all(s["tool"] in ("add", "echo") for s in suggestions)
        events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
        assert sum(e.event == "tool_suggest" for e in events) == len(suggestions)
