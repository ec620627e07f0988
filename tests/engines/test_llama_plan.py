"""llm_plan on the real local model: constrained decoding gives a plan that parses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator

from orchestrator_core.plans import plan_prompt, plan_schema
from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, read_stream, wait_status
from worker_adapters import Finish, GenerationRequest, Token
from worker_adapters.llama import LlamaAdapter

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
def adapter(gguf: Path) -> LlamaAdapter:
    return LlamaAdapter(model_path=gguf, n_ctx=1024)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_grammar_takes_the_whole_plan_schema(adapter: LlamaAdapter, seed: int) -> None:
    schema = plan_schema(TOOLS)
    _, messages = plan_prompt(
        prompt=None, messages=[{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS
    )
    assert messages is not None
    request = GenerationRequest(
        request_id=f"plan{seed}",
        prompt=None,
        messages=tuple(messages),
        seed=seed,
        max_tokens=200,
        temperature=0.5,  # the 270M base model loops on calls now and then at 0.8
        json_schema=schema,
    )
    events = [e async for e in adapter.stream(request)]
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.stop_reason == "eos", finish
    plan = json.loads("".join(e.text for e in events if isinstance(e, Token)))
    assert Draft202012Validator(schema).is_valid(plan), plan
    assert all(call["tool"] in ("add", "echo") for call in plan["calls"])


def test_tools_with_refs_convert_to_a_grammar() -> None:
    from llama_cpp.llama_grammar import LlamaGrammar

    tree = {
        "name": "tree",
        "parameters": {
            "$defs": {"n": {"type": "integer"}},
            "type": "object",
            "properties": {
                "n": {"$ref": "#/$defs/n"},
                "kids": {"type": "array", "items": {"$ref": "#"}},
            },
            "required": ["n"],
        },
    }
    assert LlamaGrammar.from_json_schema(json.dumps(plan_schema([*TOOLS, tree])), verbose=False)


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
    for seed in (1,):
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
