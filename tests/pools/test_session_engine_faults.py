"""Session-bound engines through orchestratord when things go wrong: a cancel reaches the
engine as its protocol's cancel, each engine error becomes the step's error with the right
retriability, and a session the engine lost is recreated from the run's record."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.pools.config import PoolSpec, ReplicaSpec
from orchestratord.pools.registry import build_registry
from orchestratord.runtime import Orchestrator
from test_harness.kakeya_runtime import serve_kakeya
from test_harness.salience_runtime import serve_salience
from test_harness.uma_runtime import serve_uma
from tests.conftest import make_settings
from tests.helpers import make_run, seed_on, submit, tokens_committed, wait_status

ENGINES = ["kakeya", "salience", "uma"]
# the raw-token engines tokenize here, with the sim's vocabulary (UMA tokenizes itself)
TOKENIZER = {"kakeya": {"tokenizer": "sim"}, "salience": {"tokenizer": "sim"}}


@dataclass
class Rig:
    engine: str
    client: httpx.AsyncClient
    orch: Orchestrator
    runtime: Any  # the reference runtime's test hooks (faults, store or stats)


@contextlib.asynccontextmanager
async def runtime(engine: str) -> AsyncIterator[tuple[str, Any]]:
    if engine == "kakeya":
        async with serve_kakeya() as rt:
            yield rt.address, rt
    elif engine == "salience":
        async with serve_salience() as rt:
            yield rt.address, rt
    else:
        async with serve_uma() as uma:
            yield f"unix:{uma.socket_path}", uma


@pytest.fixture(params=ENGINES)
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    async with rig_for(request.param, tmp_path) as made:
        yield made


@contextlib.asynccontextmanager
async def rig_for(engine: str, tmp_path: Path, **options: Any) -> AsyncIterator[Rig]:
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text(
        f'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        f"  - {{engine: {engine}, model: sim-1, free: true}}\n"
    )
    settings = make_settings(
        f"sqlite:///{tmp_path / 'o.db'}",
        price_tables_dir=prices,
        breakers={"engine_failures": 100},
    )
    async with runtime(engine) as (url, rt):
        replica = ReplicaSpec(
            replica_id="r1",
            url=url,
            model="sim-1",
            slots=2,
            options={**TOKENIZER.get(engine, {}), **options},
        )
        spec = PoolSpec(pool_id="p", engine=engine, replicas=[replica])
        orch = Orchestrator(settings, pools=build_registry([spec], settings))
        await orch.start()
        try:
            transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                yield Rig(engine, c, orch, rt)
        finally:
            await orch.stop()


def cancels_seen(rig: Rig) -> int:
    if rig.engine == "uma":
        return len(rig.runtime.stats.cancels)
    return int(rig.runtime.store.cancelled)


async def test_a_cancel_reaches_the_engine(rig: Rig) -> None:
    held = rig.runtime.faults.hold(3)  # the engine pauses after 3 tokens
    run_id = await make_run(rig.client, seed=seed_on(rig.engine, 1))
    step_id = (await submit(rig.client, run_id, prompt="alpha", max_tokens=40)).json()["step_id"]
    await tokens_committed(rig.orch.db, step_id, 3)
    assert (await rig.client.post(f"/v1/steps/{step_id}/cancel")).status_code == 202
    step = await wait_status(rig.client, step_id, "cancelled", "failed", "succeeded")
    assert step["status"] == "cancelled"
    assert step["output"]["text"] and step["usage"]["tokens_out"] == 3
    for _ in range(100):  # the protocol's cancel: a cancelled RPC, or a cancel frame
        if cancels_seen(rig) == 1:
            break
        await asyncio.sleep(0.02)
    assert cancels_seen(rig) == 1
    held.set()


# (engine, the fault its runtime injects, the step's error code, retriable); None: the
# step succeeds (NOT_FOUND: the session is recreated from the run's record and retried)
_GRPC: list[tuple[grpc.StatusCode, str | None, bool]] = [
    (grpc.StatusCode.NOT_FOUND, None, False),
    (grpc.StatusCode.UNAVAILABLE, "POOL_UNAVAILABLE", True),
    (grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_ERROR", True),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "ENGINE_ERROR", True),
    (grpc.StatusCode.ABORTED, "ENGINE_ERROR", True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "ENGINE_ERROR", True),
    (grpc.StatusCode.INVALID_ARGUMENT, "ENGINE_ERROR", False),
    (grpc.StatusCode.OUT_OF_RANGE, "ENGINE_ERROR", False),
    (grpc.StatusCode.PERMISSION_DENIED, "ENGINE_ERROR", False),
    (grpc.StatusCode.UNIMPLEMENTED, "ENGINE_ERROR", False),
    (grpc.StatusCode.INTERNAL, "ENGINE_ERROR", False),
    (grpc.StatusCode.UNKNOWN, "ENGINE_ERROR", False),
]
_UMA: list[tuple[str, str | None, bool]] = [
    ("E_PROTO_FRAME_TOO_LARGE", "ENGINE_ERROR", False),
    ("E_PROTO_INVALID_JSON", "ENGINE_ERROR", False),
    ("E_PROTO_BAD_REQUEST", "ENGINE_ERROR", False),
    ("E_LIMIT_PROMPT_TOO_LARGE", "ENGINE_ERROR", False),
    ("E_RUNTIME_DECODE", "ENGINE_ERROR", True),
    ("E_RUNTIME_BUSY", "ENGINE_ERROR", True),
    ("E_RUNTIME_RESOURCE_EXHAUSTED", "ENGINE_ERROR", True),
]
# Salience answers an offset that does not match its session with FAILED_PRECONDITION:
# the adapter re-reads the session and retries (the drift repair), so the step succeeds
_SALIENCE = {grpc.StatusCode.FAILED_PRECONDITION: (None, False)}
ERRORS = [
    *(("kakeya", *row) for row in _GRPC),
    *(("salience", f, *_SALIENCE.get(f, (c, r))) for f, c, r in _GRPC),
    *(("uma", *row) for row in _UMA),
]


@pytest.mark.parametrize(("engine", "fault", "code", "retriable"), ERRORS)
async def test_each_engine_error_is_the_steps_error(
    engine: str, fault: Any, code: str | None, retriable: bool, tmp_path: Path
) -> None:
    async with rig_for(engine, tmp_path) as rig:
        if engine == "uma":
            rig.runtime.faults.fail_next(1, fault)
        else:
            rig.runtime.faults.fail_next(1, fault, method="Generate")
        run_id = await make_run(rig.client, seed=seed_on(rig.engine, 1))
        step_id = (await submit(rig.client, run_id, prompt="alpha", max_tokens=5)).json()["step_id"]
        step = await wait_status(rig.client, step_id, "failed", "succeeded")
        if code is None:
            assert step["status"] == "succeeded", step.get("error")
        else:
            assert step["status"] == "failed"
            error = step["error"]
            assert error["code"] == code and error["retriable"] is retriable
            name = fault if isinstance(fault, str) else fault.name
            assert name in error["message"]
        # the run goes on: the next step on the same session succeeds
        again = (await submit(rig.client, run_id, prompt="beta", max_tokens=5, token="b")).json()
        done = await wait_status(rig.client, again["step_id"], "failed", "succeeded")
        assert done["status"] == "succeeded", done.get("error")


@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_a_session_the_engine_lost_is_recreated_from_the_runs_record(
    engine: str, tmp_path: Path
) -> None:
    async with rig_for(engine, tmp_path) as rig:
        run_id = await make_run(rig.client, seed=seed_on(rig.engine, 2))
        first = (await submit(rig.client, run_id, prompt="alpha beta ", max_tokens=4)).json()
        one = await wait_status(rig.client, first["step_id"], "failed", "succeeded")
        assert one["status"] == "succeeded"
        store = rig.runtime.store
        (old,) = store.sessions
        history = list(store.sessions[old].tokens)
        store.sessions.clear()  # the engine forgot it (restart, eviction): NOT_FOUND next
        conversation = "alpha beta " + one["output"]["text"] + "gamma"
        second = (
            await submit(rig.client, run_id, prompt=conversation, max_tokens=4, token="2")
        ).json()
        two = await wait_status(rig.client, second["step_id"], "failed", "succeeded")
        assert two["status"] == "succeeded", two.get("error")
        (new,) = store.sessions
        assert new != old
        # the new session starts with the whole recorded history, then the turn's new tokens
        assert store.sessions[new].tokens[: len(history)] == history


async def test_kakeya_output_is_byte_exact_however_the_history_was_appended(
    tmp_path: Path,
) -> None:
    """Kakeya's contract, through orchestratord: the same history and seed give identical
    tokens, whether the history was appended turn by turn or sent at once."""
    async with rig_for("kakeya", tmp_path) as rig:
        c = rig.client
        turns = await make_run(c, seed=11)
        one = (await submit(c, turns, prompt="alpha beta ", max_tokens=6)).json()
        first = await wait_status(c, one["step_id"], "failed", "succeeded")
        history = "alpha beta " + first["output"]["text"] + "gamma delta "
        two = (await submit(c, turns, prompt=history, max_tokens=6, token="2")).json()
        appended = await wait_status(c, two["step_id"], "failed", "succeeded")
        at_once_run = await make_run(c, seed=11)
        three = (await submit(c, at_once_run, prompt=history, max_tokens=6)).json()
        at_once = await wait_status(c, three["step_id"], "failed", "succeeded")
        assert appended["status"] == at_once["status"] == "succeeded"
        assert appended["output"]["token_ids"] == at_once["output"]["token_ids"]
        assert appended["output"]["text"].encode() == at_once["output"]["text"].encode()
        # and the first run's session was appended to, not recreated
        received = sorted(s.received for s in rig.runtime.store.sessions.values())
        assert received[0] < received[1]  # the turn-by-turn session got only the deltas


async def test_salience_logprobs_and_top_alternatives_are_on_token_events(
    tmp_path: Path,
) -> None:
    from tests.helpers import read_stream

    async with rig_for("salience", tmp_path, top_logprobs=3) as rig:
        run_id = await make_run(rig.client, seed=seed_on(rig.engine, 4))
        asked = (
            await submit(rig.client, run_id, prompt="alpha ", max_tokens=5, logprobs=True)
        ).json()
        plain = (await submit(rig.client, run_id, prompt="beta ", max_tokens=5, token="p")).json()
        for step in (asked, plain):
            done = await wait_status(rig.client, step["step_id"], "failed", "succeeded")
            assert done["status"] == "succeeded", done.get("error")
        events = await read_stream(rig.client, f"/v1/steps/{asked['step_id']}/stream")
        tokens = [e.data for e in events if e.event == "token" and e.data]
        assert len(tokens) == 5
        for tok in tokens:
            assert isinstance(tok["logprob"], float) and tok["logprob"] <= 0
            ranked = tok["top_logprobs"]
            assert len(ranked) == 3
            assert [r["logprob"] for r in ranked] == sorted(
                (r["logprob"] for r in ranked), reverse=True
            )
            assert tok["logprob"] <= ranked[0]["logprob"]  # nothing beats the best
        events = await read_stream(rig.client, f"/v1/steps/{plain['step_id']}/stream")
        for tok in (e.data for e in events if e.event == "token" and e.data):
            assert tok.get("logprob") is None and "top_logprobs" not in tok  # not asked


async def test_a_forked_run_forks_its_parents_engine_session(tmp_path: Path) -> None:
    """A run forked from a checkpoint starts on its parent's replica from a server-side fork
    of the parent's session at the prefix they share: the shared tokens are not sent again."""
    async with rig_for("salience", tmp_path) as rig:
        c = rig.client
        parent = await make_run(c, seed=seed_on(rig.engine, 6))
        one = (await submit(c, parent, prompt="alpha beta gamma ", max_tokens=6)).json()
        first = await wait_status(c, one["step_id"], "failed", "succeeded")
        assert first["status"] == "succeeded"
        r = await c.post(
            f"/v1/runs/{parent}/steps",
            json={"type": "checkpoint", "client_token": "cp", "input": {"state": {"turn": 1}}},
        )
        cp = await wait_status(c, r.json()["step_id"], "succeeded", "failed")
        r = await c.post(
            f"/v1/runs/{parent}/fork", json={"checkpoint_id": cp["output"]["checkpoint_id"]}
        )
        assert r.status_code == 201, r.text
        child = r.json()["run_id"]
        store = rig.runtime.store
        (parent_sid,) = store.sessions
        shared = list(store.sessions[parent_sid].tokens)
        history = "alpha beta gamma " + first["output"]["text"] + "delta "
        two = (await submit(c, child, prompt=history, max_tokens=6)).json()
        done = await wait_status(c, two["step_id"], "failed", "succeeded")
        assert done["status"] == "succeeded", done.get("error")
        assert done["replica_id"] == first["replica_id"]
        (child_sid,) = set(store.sessions) - {parent_sid}
        forked = store.sessions[child_sid]
        assert forked.tokens[: len(shared)] == shared  # the parent's conversation, forked
        from worker_adapters.tokenizers import SimTokenizer

        # only what the child added was sent: without the fork it would be the whole prompt
        assert forked.received == len(SimTokenizer().encode(history)) - len(shared)
        # and the parent's own session is untouched by the child's turn
        assert store.sessions[parent_sid].tokens == shared


@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_drift_between_engine_and_record_is_repaired(engine: str, tmp_path: Path) -> None:
    """The engine's session changed behind the run's back (a token more): the next turn
    notices (history length, offset check), repairs from the record and succeeds, and what
    the engine holds afterwards is the record, not the stray token."""
    async with rig_for(engine, tmp_path) as rig:
        c = rig.client
        run_id = await make_run(c, seed=seed_on(engine, 8))
        one = (await submit(c, run_id, prompt="alpha beta ", max_tokens=4)).json()
        first = await wait_status(c, one["step_id"], "failed", "succeeded")
        store = rig.runtime.store
        (sid,) = store.sessions
        recorded = list(store.sessions[sid].tokens)
        store.sessions[sid].tokens.append(recorded[0])  # the stray token
        history = "alpha beta " + first["output"]["text"] + "gamma "
        two = (await submit(c, run_id, prompt=history, max_tokens=4, token="2")).json()
        done = await wait_status(c, two["step_id"], "failed", "succeeded")
        assert done["status"] == "succeeded", done.get("error")
        from worker_adapters.tokenizers import SimTokenizer

        (now,) = store.sessions.values()  # the record and this turn, the stray token gone
        assert now.tokens == SimTokenizer().encode(history) + done["output"]["token_ids"]
