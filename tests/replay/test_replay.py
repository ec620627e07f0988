"""record, replay and strict_replay through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from test_harness.perturbed import PerturbedAdapter
from tests.helpers import SseEvent, make_flow, make_run, read_stream, submit, wait_status
from worker_adapters.base import Capabilities
from worker_adapters.sim import SimAdapter

PROMPTS = ["first question", "second: more detail", "third, the last"]


def _replica_adapter(orch: Orchestrator) -> SimAdapter:
    adapter = orch.pools.pools["local"].replicas[0].adapter
    assert isinstance(adapter, SimAdapter)
    return adapter


def _perturb(orch: Orchestrator, **kwargs: Any) -> PerturbedAdapter:
    replica = orch.pools.pools["local"].replicas[0]
    wrapped = PerturbedAdapter(replica.adapter, **kwargs)
    replica.adapter = wrapped
    return wrapped


async def _record(client: httpx.AsyncClient, n: int = 3, **run: Any) -> tuple[str, str, list[str]]:
    flow_id = await make_flow(client, {"replay": "suite"})
    run_id = await make_run(client, flow_id, **run)
    steps = []
    for i in range(n):
        step_id = (await submit(client, run_id, f"t{i}", PROMPTS[i], max_tokens=12)).json()[
            "step_id"
        ]
        await wait_status(client, step_id, "succeeded", "failed", "cancelled")
        steps.append(step_id)
    return flow_id, run_id, steps


async def _replay_run(client: httpx.AsyncClient, flow_id: str, source: str, mode: str) -> str:
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["mode"] == mode and body["source_run_id"] == source
    run_id: str = body["run_id"]
    return run_id


def _tokens(events: list[SseEvent]) -> list[tuple[str, int | None]]:
    return [(e.data["t"], e.data["token_id"]) for e in events if e.event == "token" and e.data]


async def _resubmit_all(client: httpx.AsyncClient, run_id: str, n: int = 3) -> list[str]:
    out = []
    for i in range(n):
        r = await submit(client, run_id, f"t{i}", PROMPTS[i], max_tokens=12)
        assert r.status_code == 202, r.text
        out.append(r.json()["step_id"])
        await wait_status(client, out[-1], "succeeded", "failed", "cancelled")
    return out


async def test_replay_serves_the_record_without_an_engine(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live)
    spy = _perturb(orch)  # counts requests; perturbs nothing
    replay = await _replay_run(live, flow_id, source, "replay")
    run = (await live.get(f"/v1/runs/{replay}")).json()
    assert run["seed"] == 42  # inherited from the record
    steps = await _resubmit_all(live, replay)
    assert spy.requests == []
    for old, new in zip(recorded, steps, strict=True):
        before = await read_stream(live, f"/v1/steps/{old}/stream")
        after = await read_stream(live, f"/v1/steps/{new}/stream")
        assert [e.event for e in after] == [e.event for e in before]
        assert _tokens(after) == _tokens(before) and _tokens(after)
        assert all(e.data and e.data["step_id"] == new for e in after)
        end_before, end_after = before[-1].data, after[-1].data
        assert end_before and end_after
        assert end_after["provenance"] == {**end_before["provenance"], "replayed_from": old}
        old_step = (await live.get(f"/v1/steps/{old}")).json()
        new_step = (await live.get(f"/v1/steps/{new}")).json()
        assert new_step["output"] == old_step["output"]
        assert new_step["replay_of"] == old and new_step["replay_outcome"] == "identical"
    report = (await live.get(f"/v1/runs/{replay}/replay-report")).json()
    assert report["diverged"] is False and report["complete"] is True
    assert report["counts"]["identical"] == 3
    assert [s["recorded_step_id"] for s in report["steps"]] == recorded


async def test_replay_miss_names_the_input_that_differs(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live, n=2)
    replay = await _replay_run(live, flow_id, source, "replay")
    other_prompt = (
        await submit(live, replay, "a", "not the recorded prompt", max_tokens=12)
    ).json()
    other_params = (await submit(live, replay, "b", PROMPTS[1], max_tokens=13)).json()
    beyond = (await submit(live, replay, "c", PROMPTS[2], max_tokens=12)).json()
    expected = [["prompt_hash"], ["params_hash"], ["position"]]
    for accepted, differs in zip((other_prompt, other_params, beyond), expected, strict=True):
        step = await wait_status(live, accepted["step_id"], "failed")
        assert step["error"]["code"] == "REPLAY_MISS"
        assert step["error"]["details"]["differs"] == differs
        assert step["replay_outcome"] == "miss"
        events = await read_stream(live, f"/v1/steps/{accepted['step_id']}/stream")
        assert [e.event for e in events] == ["started", "error"]
    first = (await live.get(f"/v1/steps/{other_prompt['step_id']}")).json()
    inputs = first["error"]["details"]["inputs"]
    assert inputs[0]["input"] == "prompt_hash"
    assert inputs[0]["recorded"] != inputs[0]["submitted"]
    assert first["error"]["details"]["recorded_step_id"] == recorded[0]
    report = (await live.get(f"/v1/runs/{replay}/replay-report")).json()
    assert report["diverged"] is True and report["counts"]["missed"] == 3
    assert report["steps"][0]["miss"]["differs"] == ["prompt_hash"]


async def test_omitted_defaults_match_explicit_ones(live: httpx.AsyncClient) -> None:
    flow_id, source, _ = await _record(live, n=1)
    replay = await _replay_run(live, flow_id, source, "replay")
    step = (
        await submit(live, replay, "t0", PROMPTS[0], max_tokens=12, top_p=1.0, temperature=1.0)
    ).json()
    body = await wait_status(live, step["step_id"], "succeeded", "failed")
    assert body["replay_outcome"] == "identical", body["error"]


async def test_strict_replay_reruns_on_the_recorded_replica(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live)
    spy = _perturb(orch)
    strict = await _replay_run(live, flow_id, source, "strict_replay")
    steps = await _resubmit_all(live, strict)
    assert len(spy.requests) == 3  # re-executed for real
    for old, new in zip(recorded, steps, strict=True):
        before = await read_stream(live, f"/v1/steps/{old}/stream")
        after = await read_stream(live, f"/v1/steps/{new}/stream")
        assert _tokens(after) == _tokens(before)
        assert after[0].data and after[0].data["replay_of"] == old
        assert after[0].data["seed"] == 42 and after[0].data["model_hash"].startswith("sha256:")
        prov_before = before[-1].data["provenance"]  # type: ignore[index]
        prov_after = after[-1].data["provenance"]  # type: ignore[index]
        for key in ("seed", "prompt_hash", "params_hash", "model_hash", "replica_id", "pool_id"):
            assert prov_after[key] == prov_before[key]
    report = (await live.get(f"/v1/runs/{strict}/replay-report")).json()
    assert report["diverged"] is False and report["counts"]["identical"] == 3


async def test_strict_replay_reports_the_first_different_token(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live, n=1)
    before = await read_stream(live, f"/v1/steps/{recorded[0]}/stream")
    expected_tokens = _tokens(before)
    _perturb(orch, at=4)
    strict = await _replay_run(live, flow_id, source, "strict_replay")
    step_id = (await submit(live, strict, "t0", PROMPTS[0], max_tokens=12)).json()["step_id"]
    step = await wait_status(live, step_id, "failed")
    events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    assert _tokens(events) == expected_tokens[:4]  # the divergent token is not streamed
    error = events[-1].data
    assert error and error["code"] == "REPLAY_DIVERGED" and events[-1].event == "error"
    text, token_id = expected_tokens[4]
    assert (
        error["details"]["divergence"]
        == {
            "step_id": step_id,
            "recorded_step_id": recorded[0],
            "position": 0,
            "token_index": 4,
            "expected": {"t": text, "token_id": token_id},
            "actual": {"t": "PERTURBED ", "token_id": token_id + 1},  # type: ignore[operator]
            "context": {
                "before": [t for t, _ in expected_tokens[:4]],
                "expected_after": [t for t, _ in expected_tokens[5:10]],
            },
        }
    )
    assert error["provenance"]["tokens_out"] == 4
    assert step["replay_outcome"] == "diverged"
    report = (await live.get(f"/v1/runs/{strict}/replay-report")).json()
    assert report["diverged"] is True and report["counts"]["diverged"] == 1
    assert report["steps"][0]["divergence"] == error["details"]["divergence"]


async def test_strict_replay_reports_an_early_end(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live, n=1)
    expected_tokens = _tokens(await read_stream(live, f"/v1/steps/{recorded[0]}/stream"))
    _perturb(orch, at=7, mode="truncate")
    strict = await _replay_run(live, flow_id, source, "strict_replay")
    step_id = (await submit(live, strict, "t0", PROMPTS[0], max_tokens=12)).json()["step_id"]
    step = await wait_status(live, step_id, "failed")
    divergence = step["error"]["details"]["divergence"]
    assert divergence["token_index"] == 7
    text, token_id = expected_tokens[7]
    assert divergence["expected"] == {"t": text, "token_id": token_id}
    assert divergence["actual"] == {"end": "eos"}


class _Rebuilt(PerturbedAdapter):
    """The same engine, reporting another build and other weights."""

    async def capabilities(self) -> Capabilities:
        caps = await super().capabilities()
        return dataclasses.replace(caps, engine_version="9.9", model_hash="sha256:" + "1" * 64)


async def test_strict_replay_refusal_lists_every_mismatch(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, _ = await _record(live, n=1)
    pool = orch.pools.pools["local"]
    pool.replicas[0].adapter = _Rebuilt(pool.replicas[0].adapter)
    await orch.pools.refresh()
    r = await live.post(
        f"/v1/flows/{flow_id}/runs",
        json={
            "mode": "strict_replay",
            "source_run_id": source,
            "seed": 7,
            "policy": {"rules": [{"id": "mask", "effect": "redact", "pattern": "secret"}]},
        },
    )
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "STRICT_REPLAY_MISMATCH"
    mismatches = {m["input"]: m for m in body["details"]["mismatches"]}
    assert set(mismatches) == {"seed", "policy", "model_hash", "engine_version"}
    assert mismatches["seed"] == {"input": "seed", "recorded": 42, "current": 7}
    assert mismatches["model_hash"]["current"] == "sha256:" + "1" * 64
    assert mismatches["model_hash"]["replica_id"] == "r0"
    # replay (not strict) needs no engine: it is not refused
    assert (
        await live.post(
            f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
        )
    ).status_code == 201
    # a deny rule does not change output, a missing replica does
    pool.replicas[0].replica_id = "r9"
    r = await live.post(
        f"/v1/flows/{flow_id}/runs",
        json={
            "mode": "strict_replay",
            "source_run_id": source,
            "policy": {"rules": [{"id": "no-tools", "effect": "deny", "match": {"tool": "x"}}]},
        },
    )
    inputs = {m["input"] for m in r.json()["details"]["mismatches"]}
    assert inputs == {"replica"}  # nothing to compare its engine with
    # another flow is another program
    other = await make_flow(live, {"another": "flow"})
    r = await live.post(
        f"/v1/flows/{other}/runs", json={"mode": "strict_replay", "source_run_id": source}
    )
    assert "flow" in {m["input"] for m in r.json()["details"]["mismatches"]}


async def test_strict_replay_reproduces_a_cancelled_record(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    adapter = _replica_adapter(orch)
    adapter.tokens_per_s = 200.0
    flow_id = await make_flow(live, {"replay": "cancel"})
    source = await make_run(live, flow_id)
    step_id = (await submit(live, source, "t0", "long one", max_tokens=500)).json()["step_id"]
    async with live.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        seen = 0
        async for line in r.aiter_lines():
            if line.startswith("event: token"):
                seen += 1
                if seen == 5:
                    await live.post(f"/v1/steps/{step_id}/cancel")
    recorded = await wait_status(live, step_id, "cancelled")
    n = recorded["usage"]["tokens_out"]
    assert 5 <= n < 500
    adapter.tokens_per_s = 0.0
    strict = await _replay_run(live, flow_id, source, "strict_replay")
    new_id = (await submit(live, strict, "t0", "long one", max_tokens=500)).json()["step_id"]
    step = await wait_status(live, new_id, "cancelled", "failed", "succeeded")
    assert step["status"] == "cancelled", step["error"]
    assert step["usage"]["tokens_out"] == n and step["replay_outcome"] == "identical"
    assert step["output"]["text"] == recorded["output"]["text"]


async def test_replay_resubmission_is_idempotent(live: httpx.AsyncClient) -> None:
    flow_id, source, _ = await _record(live, n=1)
    replay = await _replay_run(live, flow_id, source, "replay")
    first = await submit(live, replay, "t0", PROMPTS[0], max_tokens=12)
    again = await submit(live, replay, "t0", PROMPTS[0], max_tokens=12)
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["step_id"] == again.json()["step_id"]
    steps = (await live.get(f"/v1/runs/{replay}/steps")).json()
    assert [s["position"] for s in steps] == [0]


async def test_run_steps_are_listed_by_position(live: httpx.AsyncClient) -> None:
    _, source, recorded = await _record(live)
    steps = (await live.get(f"/v1/runs/{source}/steps")).json()
    assert [s["step_id"] for s in steps] == recorded
    assert [s["position"] for s in steps] == [0, 1, 2]
    assert (await live.get("/v1/runs/run_nope/steps")).status_code == 404


async def test_record_runs_have_no_replay_report(live: httpx.AsyncClient) -> None:
    _, source, _ = await _record(live, n=1)
    r = await live.get(f"/v1/runs/{source}/replay-report")
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "run_id"


async def test_unknown_source_run_is_named(live: httpx.AsyncClient) -> None:
    flow_id = await make_flow(live)
    r = await live.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": "run_missing"}
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "source_run_id"


async def test_every_event_is_logged_with_provenance(
    live: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="orchestratord.events"):
        _, _, recorded = await _record(live, n=1)
        events = await read_stream(live, f"/v1/steps/{recorded[0]}/stream")
    lines = [r for r in caplog.records if r.name == "orchestratord.events"]
    mine = [r for r in lines if r.__dict__["event"]["step_id"] == recorded[0]]
    assert [r.__dict__["event"]["seq"] for r in mine] == [int(e.id or -1) for e in events]
    for record in mine:
        provenance = record.__dict__["provenance"]
        for key in ("seed", "prompt_hash", "params_hash", "engine", "model_hash", "replica_id"):
            assert provenance[key] is not None, (record.__dict__["event"], key)
    assert mine[-1].__dict__["provenance"]["tokens_out"] == len(_tokens(events))
    assert mine[-1].levelno == logging.INFO and mine[1].levelno == logging.DEBUG
