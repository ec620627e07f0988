"""llm_plan through HTTP on the sim engine: a menu of the flow's tools, suggestions checked
against each tool's schema and the run's policy, streamed as tool_suggest events."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.helpers import make_flow, make_run, read_stream, wait_status

ADD: dict[str, Any] = {
    "name": "add",
    "description": "add two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "executor": {"kind": "builtin", "name": "echo"},
}
ECHO: dict[str, Any] = {
    "name": "echo",
    "description": "say a text back",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "executor": {"kind": "builtin", "name": "echo"},
}
SCHEMAS: dict[str, Any] = {t["name"]: t["parameters"] for t in (ADD, ECHO)}


async def plan(
    client: httpx.AsyncClient, run_id: str, token: str = "p", **extra_input: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_plan",
            "client_token": token,
            "input": {
                "prompt": "Add 2 and 3, then say the result.",
                "tools": ["add", "echo"],
                "params": {"max_tokens": 400},
                **extra_input,
            },
        },
    )


async def test_plans_report_valid_and_invalid_suggestions(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client, tools=[ADD, ECHO])
    seen_valid = seen_invalid = False
    for seed in range(1, 25):
        run_id = await make_run(client, flow_id, seed=seed)
        r = await plan(client, run_id)
        assert r.status_code == 202, r.text
        step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
        assert step["status"] == "succeeded", step
        suggestions = step["output"]["suggestions"]
        events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
        kinds = [e.event for e in events]
        assert kinds[0] == "started" and kinds[-1] == "end"
        streamed = [
            {k: e.data[k] for k in ("tool", "args", "valid", "errors")}
            for e in events
            if e.event == "tool_suggest" and e.data
        ]
        assert streamed == suggestions  # every suggestion streamed, none dropped
        assert kinds.index("end") > max(
            (i for i, k in enumerate(kinds) if k == "tool_suggest"), default=0
        )
        for s in suggestions:
            if s["tool"] in SCHEMAS and isinstance(s["args"], dict):
                errors = list(Draft202012Validator(SCHEMAS[s["tool"]]).iter_errors(s["args"]))
                assert s["valid"] == (not errors), s
            else:
                assert s["valid"] is False and s["errors"], s
            seen_valid |= s["valid"]
            seen_invalid |= not s["valid"]
        if seen_valid and seen_invalid:
            break
    assert seen_valid and seen_invalid


async def test_the_menu_is_in_the_prompt_hash(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client, tools=[ADD, ECHO])
    run_id = await make_run(client, flow_id)
    a = await wait_status(client, (await plan(client, run_id, "a")).json()["step_id"], "succeeded")
    b = await wait_status(
        client, (await plan(client, run_id, "b", tools=["add"])).json()["step_id"], "succeeded"
    )
    assert a["provenance"]["prompt_hash"] != b["provenance"]["prompt_hash"]
    assert a["input"]["tools"] == ["add", "echo"]


@pytest.mark.parametrize(
    ("step_input", "field"),
    [
        ({"prompt": "x", "tools": ["nope"]}, "input.tools[0]"),
        ({"prompt": "x", "tools": []}, "input.tools"),
        ({"prompt": "x"}, "input.tools"),
        ({"tools": ["add"]}, "input"),
        ({"prompt": "x", "tools": ["add"], "params": {"max_tokens": 0}}, "input.params.max_tokens"),
    ],
)
async def test_bad_plan_input_names_the_field(
    client: httpx.AsyncClient, step_input: dict[str, Any], field: str
) -> None:
    flow_id = await make_flow(client, tools=[ADD, ECHO])
    run_id = await make_run(client, flow_id)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "llm_plan", "client_token": "x", "input": step_input},
    )
    assert r.status_code == 422, r.text
    body = r.json()
    fields = [e["field"] for e in body["details"].get("errors", [])] or [body["details"]["field"]]
    assert field in fields, body


async def test_a_tool_the_policy_denies_is_an_invalid_suggestion(
    client: httpx.AsyncClient,
) -> None:
    flow_id = await make_flow(client, tools=[ADD, ECHO])
    policy = {"rules": [{"id": "no-echo", "effect": "deny", "match": {"tool": "echo"}}]}
    found = False
    for seed in range(1, 30):
        run_id = await make_run(client, flow_id, seed=seed, policy=policy)
        step = await wait_status(
            client, (await plan(client, run_id)).json()["step_id"], "succeeded"
        )
        for s in step["output"]["suggestions"]:
            if s["tool"] == "echo":
                assert s["valid"] is False
                assert any("no-echo" in e["message"] for e in s["errors"])
                found = True
        if found:
            break
    assert found


async def test_replay_serves_the_recorded_plan(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client, tools=[ADD, ECHO])
    source = await make_run(client, flow_id, seed=3)
    recorded = await wait_status(
        client, (await plan(client, source)).json()["step_id"], "succeeded"
    )
    for mode in ("replay", "strict_replay"):
        r = await client.post(
            f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source}
        )
        replay = r.json()["run_id"]
        step = await wait_status(
            client, (await plan(client, replay)).json()["step_id"], "succeeded", "failed"
        )
        assert step["replay_outcome"] == "identical", step
        assert step["output"]["suggestions"] == recorded["output"]["suggestions"]
