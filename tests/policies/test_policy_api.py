"""Policy at the API: deny before anything runs, redact what is stored and streamed."""

from __future__ import annotations

import logging

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Event, Step
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run, read_stream, submit, wait_status

SECRET = r"sk-[A-Za-z0-9]{8}"


async def test_deny_names_the_rule(
    client: httpx.AsyncClient, orch: Orchestrator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orchestratord.policy")
    run_id = await make_run(
        client,
        policy={
            "rules": [
                {"id": "no-local", "effect": "deny", "match": {"pool": "loc*"}},
            ]
        },
    )
    r = await submit(client, run_id)
    assert r.status_code == 403
    body = r.json()
    assert body["code"] == "POLICY_DENIED"
    assert body["details"]["rule_id"] == "no-local"
    assert "no-local" in body["message"]
    async with orch.db.read() as s:
        assert (await s.execute(sa.select(sa.func.count()).select_from(Step))).scalar_one() == 0
    assert any(getattr(rec, "rule_id", None) == "no-local" for rec in caplog.records)


async def test_allow_before_deny_and_default(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orchestratord.policy")
    run_id = await make_run(
        client,
        policy={
            "rules": [
                {"id": "ok-sim", "effect": "allow", "match": {"model": "sim-*"}},
                {"id": "deny-all", "effect": "deny", "match": {}},
            ]
        },
    )
    r = await submit(client, run_id)
    assert r.status_code == 202
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["policy_decision"] == {"rule_id": "ok-sim", "redactions": []}
    assert any(getattr(rec, "rule_id", None) == "ok-sim" for rec in caplog.records)
    other = await make_run(
        client,
        policy={
            "rules": [{"id": "deny-tools", "effect": "deny", "match": {"step_type": "tool_call"}}]
        },
    )
    assert (await submit(client, other)).status_code == 202  # no rule matched: allowed


async def test_redact_prompt_output_and_facts(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    run_id = await make_run(
        client,
        policy={
            "rules": [
                {"id": "keys", "effect": "redact", "match": {}, "pattern": SECRET},
                {
                    "id": "words",
                    "effect": "redact",
                    "match": {"step_type": "llm_call"},
                    "pattern": r"\bthe\b",
                },
            ]
        },
    )
    r = await submit(client, run_id, prompt="use sk-ABCDEFGH please", max_tokens=60)
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["input"]["prompt"] == "use [REDACTED] please"
    assert step["policy_decision"]["redactions"] == ["keys", "words"]
    assert "sk-ABCDEFGH" not in str(step)
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    streamed = "".join(e.data["t"] for e in events if e.event == "token" and e.data)
    assert streamed == step["output"]["text"]
    assert " the " not in f" {streamed} "  # the sim vocabulary says "the" often
    assert "[REDACTED]" in streamed
    assert len([e for e in events if e.event == "token"]) == step["usage"]["tokens_out"]
    fact = await client.post(
        f"/v1/runs/{run_id}/facts", json={"type": "note", "data": {"k": "key sk-ABCDEFGH", "n": 1}}
    )
    assert fact.json()["data"] == {"k": "key [REDACTED]", "n": 1}
    async with orch.db.read() as s:
        stored = (await s.execute(sa.select(Event.data).where(Event.run_id == run_id))).scalars()
        assert all("sk-ABCDEFGH" not in d for d in stored)


async def test_policy_changes_the_run_hash(client: httpx.AsyncClient) -> None:
    plain = await make_run(client)
    strict = await make_run(
        client, policy={"rules": [{"id": "x", "effect": "deny", "match": {"tool": "rm"}}]}
    )
    a = (await client.get(f"/v1/runs/{plain}")).json()
    b = (await client.get(f"/v1/runs/{strict}")).json()
    assert a["policy_hash"] != b["policy_hash"]
    assert a["policy_hash"].startswith("sha256:")


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        ([{"id": "a", "effect": "redact", "match": {}}], "policy.rules[0].pattern"),
        ([{"id": "a", "effect": "redact", "match": {}, "pattern": "("}], "policy.rules[0].pattern"),
        ([{"id": "a", "effect": "deny"}, {"id": "a", "effect": "allow"}], "policy.rules[1].id"),
    ],
)
async def test_bad_policy_is_refused_at_run_creation(
    client: httpx.AsyncClient, rules: list[dict[str, object]], field: str
) -> None:
    from tests.helpers import make_flow

    flow_id = await make_flow(client)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"policy": {"rules": rules}})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == field
