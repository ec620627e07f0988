"""A run whose turns re-send their conversation as text (the previous prompt, the model's
reply, a new question), as an interpreter re-rendering a chat does, keeps one engine session
on a session-bound pool, and each turn sends the engine only the new text's tokens."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import httpx
import pytest

from orchestratord.api.app import create_app
from tests.helpers import make_run, seed_on, submit, wait_status
from tests.pools.test_session_engines import two_replicas
from worker_adapters.sessions import continuation
from worker_adapters.tokenizers import SimTokenizer

SIM = SimTokenizer()
FIRST = "User: plan the step\nAssistant:"


def question(turn: int) -> str:
    return f"\nUser: and the gate {turn}?\nAssistant:"


async def conversation(client: httpx.AsyncClient, run_id: str, turns: int) -> list[str]:
    """Submits ``turns`` steps, each prompt the previous one + its reply + a question; the
    prompts sent."""
    prompts, prompt = [], FIRST
    for turn in range(turns):
        prompts.append(prompt)
        step_id = (await submit(client, run_id, f"t{turn}", prompt, max_tokens=6)).json()["step_id"]
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["status"] == "succeeded", step.get("error")
        prompt += step["output"]["text"] + question(turn + 1)
    return prompts


@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_turns_re_sending_their_text_open_one_session_and_send_only_new_text(
    engine: str, tmp_path: Path
) -> None:
    async with two_replicas(engine, tmp_path) as (orch, runtimes):
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            run_id = await make_run(client, seed=seed_on(engine, 3))
            probes = sum(rt.store.created for rt in runtimes)  # Salience's capabilities()
            received: list[int] = []
            prompt = FIRST
            for turn in range(4):
                step_id = (await submit(client, run_id, f"t{turn}", prompt, max_tokens=6)).json()[
                    "step_id"
                ]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
                (session,) = [s for rt in runtimes for s in rt.store.sessions.values()]
                received.append(session.received)
                reply = step["output"]["text"]
                assert reply
                prompt += reply + question(turn + 1)
            # the whole text re-tokenized is not what the engine holds: the label's bytes and
            # the reply's first word merge, as do the reply's last word and the newline
            assert SIM.encode(prompt)[: len(session.tokens)] != session.tokens
    assert sum(rt.store.created for rt in runtimes) == probes + 1  # one session, all turns
    first = len(SIM.encode(FIRST))
    added = [len(cast(list[int], continuation(SIM, question(t)))) for t in range(1, 4)]
    assert received == [first, first + added[0], first + sum(added[:2]), first + sum(added)]


async def test_strict_replay_of_a_re_rendered_run_is_identical(tmp_path: Path) -> None:
    """The tokens a turn appends are a function of the run's record and its prompt: a run
    replayed prompt by prompt in a fresh session holds the same tokens and makes the same."""
    async with two_replicas("kakeya", tmp_path) as (orch, runtimes):
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            flow_id = (await client.post("/v1/flows", json={"ast": {"k": 2}})).json()["flow_id"]
            source = await make_run(client, flow_id, seed=9)
            prompts = await conversation(client, source, 3)
            r = await client.post(
                f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
            )
            assert r.status_code == 201, r.text
            strict = r.json()["run_id"]
            for turn, prompt in enumerate(prompts):
                step_id = (await submit(client, strict, f"t{turn}", prompt, max_tokens=6)).json()[
                    "step_id"
                ]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
            report = (await client.get(f"/v1/runs/{strict}/replay-report")).json()
        sessions = [s for rt in runtimes for s in rt.store.sessions.values()]
    assert report["diverged"] is False and report["counts"]["identical"] == 3
    # one engine session per run, both holding the same tokens
    assert sum(rt.store.created for rt in runtimes) == 2
    assert len(sessions) == 2 and sessions[0].tokens == sessions[1].tokens
