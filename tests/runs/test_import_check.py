"""An imported bundle must agree with itself: a forged token, output, hash, seq or id is
refused 422 naming the event or row, and nothing is stored."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import orjson
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Step
from orchestratord.runtime import Orchestrator
from orchestratord.steps.kinds import KINDS
from orchestratord.steps.kinds.checkpoint import CheckpointStep
from orchestratord.steps.kinds.record import StepRecord
from tests.conftest import TABLES
from tests.helpers import (
    make_flow,
    make_run,
    read_stream,
    submit,
    tokens_committed,
    wait_status,
)
from tests.runs.test_transfer import Server, export, row_counts, serve
from worker_adapters.sim import SimAdapter

Bundle = dict[str, Any]
ECHO = {
    "name": "echo",
    "description": "say a text back",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    "executor": {"kind": "builtin", "name": "echo"},
}
SLEEP = {
    "name": "nap",
    "description": "wait a while",
    "parameters": {"type": "object"},
    "executor": {"kind": "builtin", "name": "sleep"},
}


@pytest.fixture
async def second(tmp_path: Path) -> AsyncIterator[Server]:
    """A fresh server to import into (the checks read the bundle, not the backend)."""
    async with serve(f"sqlite:///{tmp_path / 'second.db'}") as server:
        yield server


async def step(c: httpx.AsyncClient, run_id: str, kind: str, token: str, **inp: Any) -> str:
    r = await c.post(
        f"/v1/runs/{run_id}/steps", json={"type": kind, "client_token": token, "input": inp}
    )
    assert r.status_code == 202, r.text
    step_id: str = r.json()["step_id"]
    await wait_status(c, step_id, "succeeded", "failed", "cancelled")
    return step_id


@dataclass
class Recorded:
    run_id: str
    steps: dict[str, str]  # name -> step_id


async def record_every_kind(c: httpx.AsyncClient, orch: Orchestrator, root: Path) -> Recorded:
    """A completed run with a step of every kind, a failed one, a cancelled one with
    tokens, facts of the run and of a step, checkpoints (a step's and the run's)."""
    flow_id = await make_flow(c, ast={"program": "every-kind"}, tools=[ECHO, SLEEP])
    run_id = await make_run(
        c,
        flow_id,
        seed=5,
        fs_policy={"roots": [str(root)]},
        policy={"rules": [{"id": "r1", "effect": "allow", "match": {"step_type": "llm_call"}}]},
    )
    ids: dict[str, str] = {}
    for name, prompt in (("call", "Write a haiku about rivers."), ("call2", "Ünïcödé — ✓ 川")):
        r = await submit(c, run_id, token=name, prompt=prompt, max_tokens=12)
        assert r.status_code == 202, r.text
        ids[name] = r.json()["step_id"]
        await wait_status(c, ids[name], "succeeded")
    ids["plan"] = await step(
        c, run_id, "llm_plan", "plan", prompt="Echo hi.", tools=["echo"], params={"max_tokens": 60}
    )
    ids["tool"] = await step(c, run_id, "tool_call", "tool", tool="echo", args={"text": "hi"})
    ids["tool_failed"] = await step(c, run_id, "tool_call", "nap", tool="nap", args={"ms": "x"})
    ids["checkpoint"] = await step(c, run_id, "checkpoint", "ck", state={"k": [1, 2.5]})
    ids["gate"] = await step(c, run_id, "gate_eval", "gate", expr="size(facts) > 0")
    ids["write"] = await step(c, run_id, "fs_op", "w", op="write", path="a.txt", content="x")
    ids["read"] = await step(c, run_id, "fs_op", "r", op="read", path="a.txt")
    # a step cancelled after some of its tokens
    adapter = orch.pools.pools["local"].replicas[0].adapter
    assert isinstance(adapter, SimAdapter)
    adapter.tokens_per_s = 40.0
    r = await submit(c, run_id, token="slow", max_tokens=1000)
    ids["cancelled"] = r.json()["step_id"]
    await wait_status(c, ids["cancelled"], "running")
    await tokens_committed(orch.db, ids["cancelled"], 2)
    assert (await c.post(f"/v1/steps/{ids['cancelled']}/cancel")).status_code == 202
    await wait_status(c, ids["cancelled"], "cancelled")
    adapter.tokens_per_s = 0.0
    for body in (
        {"type": "note", "data": {"x": [1, 2.5]}, "step_id": ids["call"]},
        {"type": "score", "data": 0.25},
    ):
        assert (await c.post(f"/v1/runs/{run_id}/facts", json=body)).status_code == 201
    cp = {"state": {"n": 3}, "step_id": ids["call2"]}
    assert (await c.post(f"/v1/runs/{run_id}/checkpoint", json=cp)).status_code == 201
    done = await c.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    assert done.status_code == 200, done.text
    statuses = {n: (await c.get(f"/v1/steps/{s}")).json()["status"] for n, s in ids.items()}
    assert statuses["tool_failed"] == "failed" and statuses["cancelled"] == "cancelled"
    return Recorded(run_id, ids)


async def test_records_of_every_kind_and_their_replays_are_accepted(
    client: httpx.AsyncClient, orch: Orchestrator, second: Server, tmp_path: Path
) -> None:
    rec = await record_every_kind(client, orch, tmp_path)
    bundle = await export(client, rec.run_id)
    assert {ev["type"] for ev in bundle["events"]} >= {
        "started", "token", "tool_suggest", "fact", "checkpoint", "end", "error", "run_end"
    }  # fmt: skip
    r = await second.client.post("/v1/runs:import", json=bundle)
    assert r.status_code == 201, r.text
    assert await export(second.client, rec.run_id) == bundle

    # a replay run serves recorded events (the source's seed, facts copied anew) and misses
    flow_id = bundle["flow"]["flow_id"]
    replay = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": rec.run_id}
    )
    assert replay.status_code == 201, replay.text
    replay_id = replay.json()["run_id"]
    for name, prompt in (("call", "Write a haiku about rivers."), ("call2", "Ünïcödé — ✓ 川")):
        await step(client, replay_id, "llm_call", name, prompt=prompt, params={"max_tokens": 12})
    plan = {"prompt": "Echo hi.", "tools": ["echo"], "params": {"max_tokens": 60}}
    await step(client, replay_id, "llm_plan", "plan", **plan)
    await step(client, replay_id, "tool_call", "tool", tool="echo", args={"text": "hi"})
    await step(client, replay_id, "tool_call", "other", tool="echo", args={"text": "no"})
    replayed = await export(client, replay_id)
    assert [s["replay_outcome"] for s in replayed["steps"]] == [
        "identical", "identical", "identical", "identical", "miss"
    ]  # fmt: skip
    r = await second.client.post("/v1/runs:import", json=replayed)
    assert r.status_code == 201, r.text


# --- forgeries ---------------------------------------------------------------------------


def events_of(b: Bundle, step_id: str, kind: str | None = None) -> list[int]:
    """Indexes in ``b["events"]`` of the step's events (of one type), by seq."""
    found = [
        i
        for i, ev in enumerate(b["events"])
        if ev["step_id"] == step_id and kind in (None, ev["type"])
    ]
    return sorted(found, key=lambda i: b["events"][i]["seq"])


def edit_data(b: Bundle, i: int, change: Callable[[dict[str, Any]], None]) -> None:
    data = orjson.loads(b["events"][i]["data"])
    change(data)
    b["events"][i]["data"] = orjson.dumps(data).decode()


def step_index(b: Bundle, step_id: str) -> int:
    return next(i for i, s in enumerate(b["steps"]) if s["step_id"] == step_id)


@dataclass
class Forgery:
    """A change to a good bundle, and what the refusal must name."""

    field: str
    step: str | None = None  # the name of the step it must name
    seq: int | None = None  # the seq of the event it must name


Forge = Callable[[Bundle, Recorded], Forgery]


def token_text(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call"], "token")[3]
    edit_data(b, i, lambda d: d.update(t=d["t"] + "!"))
    return Forgery(f"events[{i}].data.t", "call", b["events"][i]["seq"])


def output_text(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["call2"])
    b["steps"][s]["output"]["text"] += " and more"
    return Forgery(f"steps[{s}].output.text", "call2")


def output_text_inside(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["call"])
    text = b["steps"][s]["output"]["text"]
    b["steps"][s]["output"]["text"] = "X" + text[1:]
    i = events_of(b, rec.steps["call"], "token")[0]
    return Forgery(f"events[{i}].data.t", "call", b["events"][i]["seq"])


def token_ids(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["call"])
    b["steps"][s]["output"]["token_ids"][2] = 999_999
    i = events_of(b, rec.steps["call"], "token")[2]
    return Forgery(f"events[{i}].data.token_id", "call", b["events"][i]["seq"])


def token_index(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call"], "token")[4]
    edit_data(b, i, lambda d: d.update(i=7))
    return Forgery(f"events[{i}].data.i", "call", b["events"][i]["seq"])


def token_shape(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call"], "token")[1]
    edit_data(b, i, lambda d: d.update(t=5))
    return Forgery(f"events[{i}].data.t", "call", b["events"][i]["seq"])


def swapped_seqs(b: Bundle, rec: Recorded) -> Forgery:
    """Two tokens swapped in the step's order, their rows and data agreeing."""
    first, second = events_of(b, rec.steps["call"], "token")[2:4]
    seqs = {first: b["events"][second]["seq"], second: b["events"][first]["seq"]}
    for i, seq in seqs.items():
        b["events"][i]["seq"] = seq

        def renumber(data: dict[str, Any], seq: int = seq) -> None:
            data["seq"] = seq

        edit_data(b, i, renumber)
    return Forgery(f"events[{first}].run_seq", "call", b["events"][first]["seq"])


def started_prompt_hash(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call"], "started")[0]
    edit_data(b, i, lambda d: d.update(prompt_hash="sha256:" + "0" * 64))
    return Forgery(f"events[{i}].data.prompt_hash", "call", 0)


def edited_input(b: Bundle, rec: Recorded) -> Forgery:
    """The prompt changed after the fact: the recorded hashes no longer match it."""
    s = step_index(b, rec.steps["call"])
    b["steps"][s]["input"]["prompt"] = "Write a haiku about mountains."
    i = events_of(b, rec.steps["call"], "started")[0]
    return Forgery(f"events[{i}].data.prompt_hash", "call", 0)


def end_params_hash(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call2"], "end")[0]
    edit_data(b, i, lambda d: d["provenance"].update(params_hash="sha256:" + "1" * 64))
    return Forgery(f"events[{i}].data.provenance.params_hash", "call2", b["events"][i]["seq"])


def step_provenance_hash(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["tool"])
    b["steps"][s]["provenance"]["prompt_hash"] = "sha256:" + "2" * 64
    return Forgery(f"steps[{s}].provenance.prompt_hash", "tool")


def started_seed(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["gate"], "started")[0]
    edit_data(b, i, lambda d: d.update(seed=6))
    return Forgery(f"events[{i}].data.seed", "gate", 0)


def run_policy_hash(b: Bundle, rec: Recorded) -> Forgery:
    b["run"]["policy"]["rules"][0]["effect"] = "deny"
    return Forgery("run.policy_hash")


def step_tokens_out(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["call"])
    b["steps"][s]["tokens_out"] += 1
    return Forgery(f"steps[{s}].tokens_out", "call")


def end_tokens_in(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["call"], "end")[0]
    edit_data(b, i, lambda d: d.update(tokens_in=d["tokens_in"] + 1))
    return Forgery(f"events[{i}].data.tokens_in", "call", b["events"][i]["seq"])


def provenance_replica(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["call"])
    b["steps"][s]["provenance"]["replica_id"] = "elsewhere"
    i = events_of(b, rec.steps["call"], "end")[0]
    return Forgery(f"steps[{s}].provenance.replica_id", "call", b["events"][i]["seq"])


def run_usage(b: Bundle, rec: Recorded) -> Forgery:
    b["run"]["tokens_out_used"] -= 3
    return Forgery("run.tokens_out_used")


def step_count(b: Bundle, rec: Recorded) -> Forgery:
    b["run"]["step_count"] += 1
    return Forgery("run.step_count")


def status_of_a_failed_step(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["tool_failed"])
    b["steps"][s]["status"] = "succeeded"
    return Forgery(f"steps[{s}].status", "tool_failed")


def error_message(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["tool_failed"])
    b["steps"][s]["error"]["message"] = "all good"
    i = events_of(b, rec.steps["tool_failed"], "error")[0]
    return Forgery(f"steps[{s}].error.message", "tool_failed", b["events"][i]["seq"])


def stop_reason(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["cancelled"])
    b["steps"][s]["output"]["stop_reason"] = "eos"
    return Forgery(f"steps[{s}].output.stop_reason", "cancelled")


def suggestions(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["plan"])
    b["steps"][s]["output"]["suggestions"] = []
    return Forgery(f"steps[{s}].output.suggestions", "plan")


def tool_result(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["tool"])
    b["steps"][s]["output"]["result"] = {"text": "bye"}
    i = events_of(b, rec.steps["tool"], "fact")[0]
    return Forgery(f"steps[{s}].output.result", "tool", b["events"][i]["seq"])


def fact_event_id(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["tool"], "fact")[0]
    edit_data(b, i, lambda d: d.update(fact_id="fact_01JFORGED"))
    return Forgery(f"events[{i}].data.fact_id", "tool", b["events"][i]["seq"])


def fact_row_data(b: Bundle, rec: Recorded) -> Forgery:
    i = next(i for i, ev in enumerate(b["events"]) if ev["step_id"] is None)  # a run's fact
    fact_id = orjson.loads(b["events"][i]["data"])["fact_id"]
    f = next(f for f, row in enumerate(b["facts"]) if row["fact_id"] == fact_id)
    b["facts"][f]["data"] = {"forged": True}
    return Forgery(f"events[{i}].data.data")


def checkpoint_event_id(b: Bundle, rec: Recorded) -> Forgery:
    i = events_of(b, rec.steps["checkpoint"], "checkpoint")[0]
    edit_data(b, i, lambda d: d.update(checkpoint_id="ckpt_01JFORGED"))
    return Forgery(f"events[{i}].data.checkpoint_id", "checkpoint", b["events"][i]["seq"])


def checkpoint_output_id(b: Bundle, rec: Recorded) -> Forgery:
    s = step_index(b, rec.steps["checkpoint"])
    posted = next(row for row in b["checkpoints"] if row["state"] == {"n": 3})
    b["steps"][s]["output"]["checkpoint_id"] = posted["checkpoint_id"]
    i = events_of(b, rec.steps["checkpoint"], "checkpoint")[0]
    return Forgery(f"steps[{s}].output.checkpoint_id", "checkpoint", b["events"][i]["seq"])


def checkpoint_state(b: Bundle, rec: Recorded) -> Forgery:
    c = next(c for c, row in enumerate(b["checkpoints"]) if row["state"] == {"n": 3})
    b["checkpoints"][c]["state"]["n"] = 4
    return Forgery(f"checkpoints[{c}].state_hash")


def run_end_status(b: Bundle, rec: Recorded) -> Forgery:
    i = next(i for i, ev in enumerate(b["events"]) if ev["type"] == "run_end")
    edit_data(b, i, lambda d: d.update(status="failed"))
    return Forgery(f"events[{i}].data.status")


FORGERIES: tuple[Forge, ...] = (
    token_text,
    output_text,
    output_text_inside,
    token_ids,
    token_index,
    token_shape,
    swapped_seqs,
    started_prompt_hash,
    edited_input,
    end_params_hash,
    step_provenance_hash,
    started_seed,
    run_policy_hash,
    step_tokens_out,
    end_tokens_in,
    provenance_replica,
    run_usage,
    step_count,
    status_of_a_failed_step,
    error_message,
    stop_reason,
    suggestions,
    tool_result,
    fact_event_id,
    fact_row_data,
    checkpoint_event_id,
    checkpoint_output_id,
    checkpoint_state,
    run_end_status,
)


async def test_forged_records_are_refused_naming_what_disagrees_and_store_nothing(
    client: httpx.AsyncClient, orch: Orchestrator, second: Server, tmp_path: Path
) -> None:
    rec = await record_every_kind(client, orch, tmp_path)
    bundle = await export(client, rec.run_id)
    for forge in FORGERIES:
        forged = copy.deepcopy(bundle)
        want = forge(forged, rec)
        r = await second.client.post("/v1/runs:import", json=forged)
        assert r.status_code == 422, (forge.__name__, r.text)
        body = r.json()
        assert body["code"] == "INVALID_PARAMS"
        assert body["details"]["errors"][0]["field"] == want.field, (forge.__name__, r.text)
        assert body["message"].startswith(want.field), (forge.__name__, body["message"])
        if want.step is not None:
            step_id = rec.steps[want.step]
            assert body["details"]["step_id"] == step_id, (forge.__name__, r.text)
            assert step_id in body["message"], (forge.__name__, body["message"])
        if want.seq is not None:
            assert body["details"]["seq"] == want.seq, (forge.__name__, r.text)
    assert await row_counts(second.orch) == dict.fromkeys(TABLES, 0)
    assert (await second.client.post("/v1/runs:import", json=bundle)).status_code == 201


class Stamped(CheckpointStep):
    """A kind made up here, registered by the test alone: a checkpoint whose output must
    carry a stamp. Its record rule lives with it, as every kind's does."""

    step_type: ClassVar[str] = "stamped"

    def check_record(self, record: StepRecord) -> None:
        super().check_record(record)
        if record.output.get("stamp") != "ok":
            record.refuse("is not stamped", field=f"{record.path}.output.stamp")


async def test_a_kinds_record_rule_is_its_own_and_import_knows_the_registered_kinds(
    client: httpx.AsyncClient, second: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow_id = await make_flow(client, ast={"program": "stamped"})
    run_id = await make_run(client, flow_id)
    body = {"type": "checkpoint", "client_token": "ck", "input": {"state": {"k": 1}}}
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    step_id = r.json()["step_id"]
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")  # to its end
    assert events[-1].event == "end", events
    done = await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    assert done.status_code == 200, done.text
    bundle = await export(client, run_id)
    s = step_index(bundle, step_id)
    bundle["steps"][s]["type"] = "stamped"

    r = await second.client.post("/v1/runs:import", json=bundle)  # no such kind here
    assert r.status_code == 422, r.text
    assert r.json()["details"]["errors"][0]["field"] == f"steps[{s}].type"

    monkeypatch.setitem(KINDS, "stamped", Stamped())
    r = await second.client.post("/v1/runs:import", json=bundle)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["details"]["errors"][0]["field"] == f"steps[{s}].output.stamp"
    assert body["message"] == f"steps[{s}].output.stamp: is not stamped (step {step_id})"
    assert body["details"]["step_id"] == step_id
    assert await row_counts(second.orch) == dict.fromkeys(TABLES, 0)

    bundle["steps"][s]["output"]["stamp"] = "ok"
    r = await second.client.post("/v1/runs:import", json=bundle)
    assert r.status_code == 201, r.text
    async with second.orch.db.read() as session:
        row = (await session.execute(sa.select(Step).where(Step.step_id == step_id))).scalar_one()
    assert (row.type, row.output) == ("stamped", bundle["steps"][s]["output"])
