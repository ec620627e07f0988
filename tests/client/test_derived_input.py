"""The client learns which input fields the server derives from the OpenAPI document (its
``readOnly`` properties), and leaves them out of a replayed step's submission."""

from __future__ import annotations

import copy
from typing import Any

import httpx

from orchestrator_client.replay import contract_derived_input, derived_input, replay_step_body
from tests.helpers import make_flow, make_run, read_stream

ECHO = {
    "name": "echo",
    "description": "say a text back",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    "executor": {"kind": "builtin", "name": "echo"},
}


def document(**marks: dict[str, Any]) -> dict[str, Any]:
    """A small OpenAPI document: two step requests, their inputs' properties as given."""
    ref = "#/components/schemas/{}".format
    return {
        "components": {
            "schemas": {
                "CallStep": {
                    "properties": {
                        "type": {"const": "call", "type": "string"},
                        "input": {"$ref": ref("CallInput")},
                    }
                },
                "PlanStep": {
                    "properties": {
                        "type": {"const": "plan", "type": "string"},
                        "input": {"$ref": ref("PlanInput")},
                    }
                },
                "CallInput": {"properties": marks.get("call", {"prompt": {"type": "string"}})},
                "PlanInput": {
                    "properties": marks.get(
                        "plan",
                        {
                            "prompt": {"type": "string"},
                            "menu": {"type": "array", "readOnly": True},
                        },
                    )
                },
                # a schema that is no step request: its readOnly fields are not an input's
                "StepOut": {"properties": {"step_id": {"type": "string", "readOnly": True}}},
            }
        }
    }


def test_readonly_input_properties_are_what_the_server_derives() -> None:
    assert derived_input(document()) == {"plan": frozenset({"menu"})}


def test_marking_another_field_readonly_makes_it_derived() -> None:
    marked = document(
        call={"prompt": {"type": "string"}, "model": {"type": "string", "readOnly": True}},
        plan={
            "prompt": {"type": "string", "readOnly": False},
            "menu": {"readOnly": True},
            "template": {"readOnly": True},
        },
    )
    assert derived_input(marked) == {
        "call": frozenset({"model"}),
        "plan": frozenset({"menu", "template"}),
    }
    assert derived_input({}) == {}


def test_the_packaged_contract_marks_a_plans_tool_specs_and_template() -> None:
    assert contract_derived_input() == {"llm_plan": frozenset({"tool_specs", "template"})}
    assert contract_derived_input() is contract_derived_input()  # read once


def test_a_replayed_plan_leaves_out_what_the_server_derived() -> None:
    submitted = {"prompt": "Echo hi.", "tools": ["echo"], "params": {"max_tokens": 60}}
    recorded = {
        "step_id": "step_old",
        "type": "llm_plan",
        "client_token": "p",
        "input": {
            **submitted,
            "tool_specs": [{"name": "echo", "description": "", "parameters": {}}],
            "template": "plan-v1",
        },
        "budgets": None,
        "placement": "auto",
        "priority": "interactive",
    }
    assert replay_step_body(recorded) == {
        "type": "llm_plan",
        "client_token": "p",
        "input": submitted,
        "budgets": None,
        "placement": None,
        "priority": "interactive",
    }
    call = copy.deepcopy(recorded) | {"type": "llm_call"}  # another kind keeps its input
    assert replay_step_body(call)["input"] == recorded["input"]


async def test_the_contract_marks_exactly_what_the_server_adds_to_a_plan(
    client: httpx.AsyncClient,
) -> None:
    """The server's stored input is the submission plus the fields the document marks; the
    submission the client rebuilds from it is accepted."""
    flow_id = await make_flow(client, tools=[ECHO])
    run_id = await make_run(client, flow_id)
    submitted = {"prompt": "Echo hi.", "tools": ["echo"], "params": {"max_tokens": 40}}
    body = {"type": "llm_plan", "client_token": "p", "input": submitted}
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    step_id = r.json()["step_id"]
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")  # to its end
    assert events[-1].event == "end", events
    step = (await client.get(f"/v1/steps/{step_id}")).json()
    stored = step["input"]
    assert set(stored) - set(submitted) == contract_derived_input()["llm_plan"]
    again = replay_step_body(step)
    assert {k: again["input"][k] for k in submitted} == submitted
    r = await client.post(f"/v1/runs/{run_id}/steps", json=again | {"client_token": "q"})
    assert r.status_code == 202, r.text
    with_derived = {**again, "client_token": "r", "input": stored}  # as the server refuses it
    r = await client.post(f"/v1/runs/{run_id}/steps", json=with_derived)
    assert r.status_code == 422, r.text
