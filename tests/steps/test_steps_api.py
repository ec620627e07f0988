from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Event, Step
from orchestratord.runtime import Orchestrator
from tests.helpers import make_flow, make_run, read_stream, submit, wait_status

HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


async def test_step_record_has_output_usage_and_provenance(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client, seed=5)
    step_id = (await submit(client, run_id, max_tokens=12)).json()["step_id"]
    step = await wait_status(client, step_id, "succeeded")
    assert step["position"] == 0
    assert step["usage"]["tokens_out"] == 12
    assert step["output"]["stop_reason"] == "length"
    assert len(step["output"]["token_ids"]) == 12
    prov = step["provenance"]
    assert set(prov) == {
        "seed",
        "prompt_hash",
        "params_hash",
        "engine",
        "engine_version",
        "model_hash",
        "pool_id",
        "replica_id",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "decode_time_ms",
        "price_table",
        "price",
        "policy_hash",
        "model",
    }
    assert prov["seed"] == 5
    assert HASH.match(prov["prompt_hash"]) and HASH.match(prov["params_hash"])
    assert HASH.match(prov["model_hash"])
    assert prov["engine"] == "sim" and prov["engine_version"]
    assert (prov["pool_id"], prov["replica_id"]) == ("local", "r0")
    assert prov["tokens_out"] == 12 and prov["tokens_in"] >= 1
    assert prov["cost_usd"] == 0.0
    assert prov["price"] == {"source": "table", "entry": 0, "free": True}
    assert prov["decode_time_ms"] >= 0
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    assert events[-1].data is not None
    assert events[-1].data["provenance"] == prov
    text = "".join(e.data["t"] for e in events if e.event == "token" and e.data)
    assert text == step["output"]["text"]
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == 12
    assert run["step_count"] == 1


async def test_same_inputs_same_tokens(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    outs = []
    for _ in range(2):
        run_id = await make_run(client, flow_id, seed=77)
        step_id = (await submit(client, run_id, prompt="same")).json()["step_id"]
        outs.append((await wait_status(client, step_id, "succeeded"))["output"])
    assert outs[0] == outs[1]


async def test_messages_input(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "m",
            "input": {
                "messages": [{"role": "user", "content": "hi"}],
                "params": {"max_tokens": 4, "stop": ["zzz"]},
            },
        },
    )
    assert r.status_code == 202, r.text
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["input"]["messages"] == [{"role": "user", "content": "hi"}]


async def test_repeat_returns_first_step(client: httpx.AsyncClient, orch: Orchestrator) -> None:
    run_id = await make_run(client)
    first = await submit(client, run_id, token="k")
    again = await submit(client, run_id, token="k")
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["step_id"] == again.json()["step_id"]
    await wait_status(client, first.json()["step_id"], "succeeded")
    third = await submit(client, run_id, token="k")
    assert third.json() == {"step_id": first.json()["step_id"], "status": "succeeded"}


async def test_sixteen_concurrent_repeats_run_once(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    run_id = await make_run(client)
    responses = await asyncio.gather(*(submit(client, run_id, token="burst") for _ in range(16)))
    ids = {r.json()["step_id"] for r in responses}
    assert len(ids) == 1
    assert sorted(r.status_code for r in responses) == [200] * 15 + [202]
    (step_id,) = ids
    await wait_status(client, step_id, "succeeded")
    async with orch.db.read() as s:
        n_steps = (
            await s.execute(
                sa.select(sa.func.count()).select_from(Step).where(Step.run_id == run_id)
            )
        ).scalar_one()
        n_started = (
            await s.execute(
                sa.select(sa.func.count())
                .select_from(Event)
                .where(Event.step_id == step_id, Event.type == "started")
            )
        ).scalar_one()
    assert n_steps == 1
    assert n_started == 1
    # the fifteen that lost the token gave back the position and the tokens they reserved
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 1
    assert run["reserved"] == {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
    nxt = await submit(client, run_id, token="next")
    assert (await client.get(f"/v1/steps/{nxt.json()['step_id']}")).json()["position"] == 1


async def test_token_reused_for_other_request_conflicts(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    await submit(client, run_id, token="k", prompt="a")
    r = await submit(client, run_id, token="k", prompt="b")
    assert r.status_code == 409
    assert r.json()["code"] == "CONFLICT"
    assert r.json()["details"]["client_token"] == "k"


async def test_token_is_scoped_to_its_run(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    a = await make_run(client, flow_id)
    b = await make_run(client, flow_id)
    sa_ = (await submit(client, a, token="k")).json()["step_id"]
    sb = (await submit(client, b, token="k")).json()["step_id"]
    assert sa_ != sb


@pytest.mark.parametrize(
    ("step_input", "field"),
    [
        ({"prompt": 3}, "input.prompt"),
        ({}, "input"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "input"),
        ({"prompt": "a", "params": {"max_tokens": 0}}, "input.params.max_tokens"),
        ({"prompt": "a", "params": {"temperature": 9}}, "input.params.temperature"),
        ({"prompt": "a", "params": {"top_p": 0}}, "input.params.top_p"),
        ({"prompt": "a", "params": {"bogus": 1}}, "input.params.bogus"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "input.messages.0.role"),
    ],
)
async def test_bad_llm_input_names_field(
    client: httpx.AsyncClient, step_input: dict[str, object], field: str
) -> None:
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "llm_call", "client_token": "x", "input": step_input},
    )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "INVALID_PARAMS"
    assert field in [e["field"] for e in body["details"]["errors"]]
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 0  # nothing stored for refused input


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "llm_chat", "client_token": "x"}, "type"),
        ({"type": "llm_call"}, "client_token"),
        ({"type": "llm_call", "client_token": ""}, "client_token"),
        ({"type": "llm_call", "client_token": "x", "placement": {"pin": 3}}, "placement"),
    ],
)
async def test_bad_step_body_names_field(
    client: httpx.AsyncClient, body: dict[str, object], field: str
) -> None:
    run_id = await make_run(client)
    r = await client.post(f"/v1/runs/{run_id}/steps", json={"input": {"prompt": "a"}, **body})
    assert r.status_code == 422
    assert any(e["field"].startswith(field) for e in r.json()["details"]["errors"]), r.json()


def test_a_type_no_kind_serves_is_refused_naming_the_field() -> None:
    from orchestrator_core.errors import Unsupported
    from orchestratord.steps.kinds import KINDS, kind_of

    assert sorted(KINDS) == sorted(
        ["llm_call", "llm_plan", "tool_call", "fs_op", "gate_eval", "checkpoint"]
    )
    with pytest.raises(Unsupported) as info:
        kind_of("telepathy")
    assert info.value.details["field"] == "type"


@pytest.mark.parametrize("mode", ["replay", "strict_replay"])
async def test_replay_modes_need_a_source_run(client: httpx.AsyncClient, mode: str) -> None:
    flow_id = await make_flow(client)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": mode})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "source_run_id"
    source = await make_run(client, flow_id)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"source_run_id": source})
    assert r.status_code == 422  # a record run has no source
    assert r.json()["details"]["errors"][0]["field"] == "source_run_id"
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source})
    assert r.status_code == 201 and r.json()["mode"] == mode


async def test_placement_on_step(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "p",
            "input": {"prompt": "a"},
            "placement": {"pin": "elsewhere"},
        },
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "placement.pin"
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "q",
            "input": {"prompt": "a"},
            "placement": {"affinity": {"location": "local"}},
        },
    )
    assert r.status_code == 202
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["pool_id"] == "local"


async def test_unknown_step_and_run(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/steps/step_x")).status_code == 404
    assert (await client.get("/v1/steps/step_x/stream")).status_code == 404
    assert (await client.post("/v1/steps/step_x/cancel")).status_code == 404
    r = await submit(client, "run_missing")
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("placement", "field", "message"),
    [
        (
            "nearest",
            "placement",
            'must be "auto", {"pin": pool_id} or {"affinity": {tag: value} or a selector}',
        ),
        ({"pool": "a"}, "placement", 'must be "auto", {"pin": pool_id} or {"affinity":'),
        (7, "placement", "must be"),
        ({"pin": 5}, "placement.pin", "valid string"),
        ({"pin": ""}, "placement.pin", "at least 1 character"),
        ({"pin": "a", "x": 1}, "placement.x", "Extra inputs"),
        ({"affinity": {"gpu": 1}}, "placement.affinity.gpu", "valid string"),
        ({"affinity": {"in": {"region": "eu"}}}, "placement.affinity.in.region", "valid list"),
        ({"affinity": {"min_vram_gib": 0}}, "placement.affinity.min_vram_gib", "greater than"),
        ({"affinity": {"tags": {}, "near": 1}}, "placement.affinity.near", "Extra inputs"),
        ({"affinity": 3}, "placement.affinity", 'must be {tag: value} or a selector {"tags"'),
    ],
)
async def test_a_malformed_placement_is_refused_once_naming_what_it_accepts(
    client: httpx.AsyncClient, placement: Any, field: str, message: str
) -> None:
    """One error per bad placement, at the field of the form it is written in (not one per
    form pydantic tried: ``placement.literal['auto']``, ``placement.PinPlacement.pin``)."""
    run_id = await make_run(client)
    body = {"type": "llm_call", "client_token": "p", "input": {"prompt": "a"}}
    r = await client.post(f"/v1/runs/{run_id}/steps", json={**body, "placement": placement})
    assert r.status_code == 422, r.text
    [error] = r.json()["details"]["errors"]
    assert error["field"] == field and message in error["message"], error
    flow_id = (await client.get(f"/v1/runs/{run_id}")).json()["flow_id"]
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"pool_policy": placement})
    assert r.status_code == 422, r.text
    [error] = r.json()["details"]["errors"]
    assert error["field"] == field.replace("placement", "pool_policy", 1), error


@pytest.mark.parametrize(
    ("asked", "field", "said"),
    [
        ({"model": "gpt-4o"}, "input.model", "no pool serves model 'gpt-4o' (served: sim-1"),
        ({"params": {"logprobs": True}}, "input.params.logprobs", "offers logprobs"),
    ],
)
async def test_a_step_no_pool_serves_is_refused_naming_what_it_asks(
    client: httpx.AsyncClient, asked: dict[str, Any], field: str, said: str
) -> None:
    run_id = await make_run(client)
    body = {"type": "llm_call", "client_token": "x", "input": {"prompt": "a", **asked}}
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 422, r.text
    [error] = r.json()["details"]["errors"]
    assert error["field"] == field and said in error["message"], error
    assert (await client.get(f"/v1/runs/{run_id}/steps")).json() == []
    # what the pool serves is taken
    body = {"type": "llm_call", "client_token": "y", "input": {"prompt": "a", "model": "sim-1"}}
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    assert (await wait_status(client, r.json()["step_id"], "succeeded"))["pool_id"] == "local"
