"""The Evergreen front door through a real gRPC client built on the published schema: a
session is a run, actions are steps, outputs stream as fragments; the seed's examples, its
abort rules, dedupe, a barrier wait, auth, a client cancel, a strict replay, a tool action."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
import pytest

from orchestrator_core.keys import Scope
from orchestratord.auth import store
from orchestratord.evergreen.server import EvergreenServer
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.evergreen.upstream import (
    action,
    end_of_turn,
    generate_config,
    json_node,
    message,
    metadata,
    parent,
    sent,
    start,
    text,
)
from tests.helpers import make_flow, started_client, wait_status
from tests.procs import free_port, process

ECHO_TOOL = {
    "name": "echo",
    "description": "its args",
    "parameters": {"type": "object"},
    "executor": {"kind": "builtin", "name": "echo"},
}


@dataclass
class Door:
    orch: Orchestrator
    http: httpx.AsyncClient
    port: int
    flow_id: str

    def md(
        self, run: dict[str, Any] | None = None, key: str | None = None
    ) -> list[tuple[str, str]]:
        return metadata(self.flow_id, run, key)

    async def run(self, run_id: str) -> dict[str, Any]:
        body: dict[str, Any] = (await self.http.get(f"/v1/runs/{run_id}")).json()
        return body

    async def steps(self, run_id: str) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = (await self.http.get(f"/v1/runs/{run_id}/steps")).json()
        return body


async def _door(orch: Orchestrator) -> AsyncIterator[Door]:
    async with started_client(orch) as http:
        server = EvergreenServer(orch, host="127.0.0.1", port=0)
        port = await server.start()
        try:
            flow_id = await make_flow(http, {"evergreen": 1}, tools=[ECHO_TOOL])
            yield Door(orch, http, port, flow_id)
        finally:
            await server.stop()


@pytest.fixture
async def door(db_url: str) -> AsyncIterator[Door]:
    settings = make_settings(db_url, evergreen={"input_wait_s": 0.3})
    async for d in _door(Orchestrator(settings)):
        yield d


def _both(node_id: str) -> Any:
    """A fragment naming children and carrying a chunk."""
    fragment = text(node_id, "x")
    fragment.child_ids.append("c")
    return fragment


def _shape(fragments: list[Any]) -> list[tuple[int, bool, str | None]]:
    """(seq, continued, mimetype on that fragment) of each fragment."""
    return [
        (
            f.seq,
            f.continued,
            f.chunk_fragment.metadata.mimetype if f.chunk_fragment.HasField("metadata") else None,
        )
        for f in fragments
    ]


async def test_a_two_turn_conversation_names_the_first_turn_by_id(door: Door) -> None:
    first = message(
        action("GENERATE", {"prompt": "prompt_1"}, {"response": "response_1"}),
        parent("prompt_1", "question_1"),
        text("question_1", "Write a summary of this race: "),
    )
    second = message(
        action("GENERATE", {"prompt": "prompt_2"}, {"response": "response_2"}),
        parent("prompt_2", "prompt_1", "response_1", "question_2"),
        text("question_2", " Who's winning?"),
    )
    # both turns at once: the second waits for the first's response (a barrier)
    out = await start(door.port, door.md(), sent(first, second))
    assert out.code == grpc.StatusCode.OK, out.details
    for node in ("response_1", "response_2"):
        fragments = out.fragments(node)
        shape = _shape(fragments)
        assert shape[0] == (0, True, "text/plain"), shape  # metadata on seq 0 only
        assert [s for s, _, _ in shape] == list(range(len(shape)))
        assert all(m is None for _, _, m in shape[1:])
        assert [c for _, c, _ in shape] == [True] * (len(shape) - 1) + [False]
    run = await door.run(out.run_id)
    assert run["status"] == "succeeded"
    steps = await door.steps(out.run_id)
    assert [s["type"] for s in steps] == ["llm_call", "llm_call"]
    assert out.text_of("response_1") == steps[0]["output"]["text"]
    assert steps[0]["input"]["prompt"] == "Write a summary of this race: "
    # a plain prompt's answer stays plain text: the second prompt extends the first
    assert steps[1]["input"]["prompt"] == (
        "Write a summary of this race: " + out.text_of("response_1") + " Who's winning?"
    )


async def test_a_conversation_with_roles_is_a_chat_and_its_answers_are_the_model_s(
    door: Door,
) -> None:
    out = await start(
        door.port,
        door.md(),
        sent(
            message(
                action("GENERATE", {"prompt": "p1"}, {"response": "r1"}),
                parent("p1", "q1"),
                text("q1", "Hi there.", role="user"),
            ),
            message(
                action("GENERATE", {"prompt": "p2"}, {"response": "r2"}),
                parent("p2", "p1", "r1", "q2"),
                text("q2", "And then?", role="user"),
            ),
        ),
    )
    assert out.code == grpc.StatusCode.OK, out.details
    assert out.fragments("r1")[0].chunk_fragment.metadata.role == "model"
    steps = await door.steps(out.run_id)
    assert steps[1]["input"]["messages"] == [
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": out.text_of("r1")},
        {"role": "user", "content": "And then?"},
    ]


async def test_a_prompt_streamed_in_two_fragments_with_a_config_and_end_of_turn(
    door: Door,
) -> None:
    out = await start(
        door.port,
        door.md(),
        sent(
            message(
                action(
                    "GENERATE",
                    {"text": "prompt_1"},
                    {"text": "response_1"},
                    configs=[generate_config(max_tokens=3, temperature=0.0)],
                ),
                parent("prompt_1", "prompt_1_text", continued=True),
                text("prompt_1_text", "Write a heroic novel about a half-eaten jam doughnut."),
            ),
            message(parent("prompt_1", "prompt_1_eot", seq=1), end_of_turn("prompt_1_eot")),
        ),
    )
    assert out.code == grpc.StatusCode.OK, out.details
    (step,) = await door.steps(out.run_id)
    assert step["input"]["params"] == {"max_tokens": 3, "temperature": 0.0}
    assert step["input"]["prompt"] == "Write a heroic novel about a half-eaten jam doughnut."
    assert step["usage"]["tokens_out"] == 3
    assert out.text_of("response_1") == step["output"]["text"]


async def test_a_repeated_fragment_is_kept_once(door: Door) -> None:
    frag = text("q", "Say hi", seq=0, continued=True)
    out = await start(
        door.port,
        door.md(),
        sent(
            message(action("GENERATE", {"prompt": "q"}, {"response": "r"}), frag),
            message(frag, text("q", " twice", seq=1)),
        ),
    )
    assert out.code == grpc.StatusCode.OK, out.details
    (step,) = await door.steps(out.run_id)
    assert step["input"]["prompt"] == "Say hi twice"


@pytest.mark.parametrize(
    ("messages", "code", "says"),
    [
        (
            [text("q", "a"), text("q", "b", seq=1)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "seq",
        ),
        (
            [text("q", "a", continued=True), text("q", "b", seq=1, metadata=True)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "metadata",
        ),
        (
            [_both("q")],
            grpc.StatusCode.INVALID_ARGUMENT,
            "q",
        ),
        (
            [
                text("q", "a"),
                action("GENERATE", {"prompt": "q"}, {"response": "r"}),
                action("GENERATE", {"prompt": "q"}, {"response": "r"}),
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "output id already used",
        ),
        (
            [
                text("q", "a"),
                action(
                    "GENERATE",
                    {"prompt": "q"},
                    {"response": "r"},
                    configs=[generate_config()],
                ),
            ],
            None,  # accepted: our own config type
            None,
        ),
        (
            [parent("a", "b"), parent("b", "a"), action("GENERATE", {"prompt": "a"}, {})],
            grpc.StatusCode.INVALID_ARGUMENT,
            "cycle",
        ),
        (
            [action("GENERATE", {"prompt": "never_sent"}, {"response": "r"})],
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "never_sent",
        ),
        (
            [text("q", "a"), action("NOPE", {"prompt": "q"}, {})],
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown action 'NOPE'",
        ),
    ],
    ids=[
        "past-final",
        "metadata-late",
        "children-and-chunk",
        "output-reused",
        "config-ok",
        "cycle",
        "barrier-times-out",
        "unknown-action",
    ],
)
async def test_each_abort_rule(
    door: Door, messages: list[Any], code: Any, says: str | None
) -> None:
    out = await start(door.port, door.md(), sent(message(*messages)))
    if code is None:
        assert out.code == grpc.StatusCode.OK, out.details
        return
    assert out.code == code, (out.code, out.details)
    assert says is not None and says in out.details, out.details
    assert out.error["message"] == out.details
    assert (await door.run(out.run_id))["status"] == "failed"


async def test_an_unknown_config_type_aborts_naming_it(door: Door) -> None:
    from google.protobuf import any_pb2, duration_pb2  # type: ignore[import-untyped]

    other = any_pb2.Any()
    other.Pack(duration_pb2.Duration(seconds=1))
    out = await start(
        door.port,
        door.md(),
        sent(message(text("q", "a"), action("GENERATE", {"prompt": "q"}, {}, configs=[other]))),
    )
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "type.googleapis.com/google.protobuf.Duration" in out.details


async def test_a_flow_tool_is_an_action(door: Door) -> None:
    out = await start(
        door.port,
        door.md(),
        sent(
            message(
                json_node("args_1", {"x": 1}), action("echo", {"args": "args_1"}, {"result": "res"})
            )
        ),
    )
    assert out.code == grpc.StatusCode.OK, out.details
    (fragment,) = out.fragments("res")
    assert fragment.chunk_fragment.metadata.mimetype == "application/json"
    (step,) = await door.steps(out.run_id)
    assert (step["type"], step["input"]) == ("tool_call", {"tool": "echo", "args": {"x": 1}})
    import json

    assert json.loads(fragment.chunk_fragment.data) == step["output"]


async def test_a_recorded_session_strict_replays_identically(door: Door) -> None:
    def turn(n: int) -> Any:
        return message(
            action(
                "GENERATE",
                {"prompt": f"p{n}"},
                {"response": f"r{n}"},
                configs=[generate_config(max_tokens=6, temperature=0.8)],
            ),
            text(f"p{n}", f"turn {n}: tell me something"),
        )

    recorded = await start(door.port, door.md({"seed": 11}), sent(turn(1), turn(2)))
    assert recorded.code == grpc.StatusCode.OK, recorded.details
    replay = {"mode": "strict_replay", "source_run_id": recorded.run_id}
    again = await start(door.port, door.md(replay), sent(turn(1), turn(2)))
    assert again.code == grpc.StatusCode.OK, again.details
    for node in ("r1", "r2"):
        assert again.text_of(node) == recorded.text_of(node) != ""
    run = await door.run(again.run_id)
    assert (run["mode"], run["status"]) == ("strict_replay", "succeeded")


async def test_a_bad_run_or_flow_refuses_the_session(door: Door) -> None:
    out = await start(door.port, [("x-run", "{}")], sent())
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and "x-flow-id" in out.details
    out = await start(door.port, door.md({"mode": "nope"}), sent())
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and "x-run.mode" in out.details
    out = await start(door.port, metadata("flow_missing"), sent())
    assert out.code == grpc.StatusCode.NOT_FOUND


async def test_a_client_cancel_cancels_the_run_and_stops_the_engine(db_url: str) -> None:
    settings = make_settings(db_url, sim={"tokens_per_s": 40.0})
    async for door in _door(Orchestrator(settings)):
        out = await start(
            door.port,
            door.md(),
            sent(
                message(
                    text("q", "a long one"),
                    action(
                        "GENERATE",
                        {"prompt": "q"},
                        {"response": "r"},
                        configs=[generate_config(max_tokens=400)],
                    ),
                )
            ),
            cancel_after=2,
        )
        assert out.code == grpc.StatusCode.CANCELLED
        run_id = out.run_id
        for _ in range(200):
            steps = await door.steps(run_id)
            if steps and steps[0]["status"] == "cancelled":
                break
            await asyncio.sleep(0.05)
        assert steps[0]["status"] == "cancelled"
        assert steps[0]["usage"]["tokens_out"] < 400  # the engine stopped
        assert (await door.run(run_id))["status"] == "cancelled"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_auth_is_the_http_api_s(db_url: str) -> None:
    settings = make_settings(db_url, auth={"enabled": True, "cache_s": 0})
    orch = Orchestrator(settings)
    async for door in _door_with_keys(orch):
        read = await _key(orch, Scope.READ)
        write = await _key(orch, Scope.WRITE)
        hello = sent(
            message(text("q", "hi"), action("GENERATE", {"prompt": "q"}, {"response": "r"}))
        )
        out = await start(door.port, door.md(), hello)
        assert out.code == grpc.StatusCode.UNAUTHENTICATED
        out = await start(door.port, door.md(key=read), sent())
        assert out.code == grpc.StatusCode.PERMISSION_DENIED
        assert out.error["code"] == "FORBIDDEN"
        out = await start(
            door.port,
            door.md(key=write),
            sent(message(text("q", "hi"), action("GENERATE", {"prompt": "q"}, {"response": "r"}))),
        )
        assert out.code == grpc.StatusCode.OK, out.details


async def _key(orch: Orchestrator, scope: Scope) -> str:
    async with orch.db.write() as session:
        return await store.create(session, scope=scope, name=None)


async def _door_with_keys(orch: Orchestrator) -> AsyncIterator[Door]:
    """The door of a server with keys on: the flow made with an admin key."""
    async with started_client(orch) as http:
        admin = await _key(orch, Scope.ADMIN)
        http.headers["authorization"] = f"Bearer {admin}"
        server = EvergreenServer(orch, host="127.0.0.1", port=0)
        port = await server.start()
        try:
            yield Door(orch, http, port, await make_flow(http, {"evergreen": 2}))
        finally:
            await server.stop()


def test_serve_opens_the_front_door_beside_http(tmp_path: Path) -> None:
    port, evergreen = free_port(), free_port()
    args = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port), "--engine", "sim"]
    args += ["--database-url", f"sqlite:///{tmp_path / 'o.db'}", "--evergreen-port", str(evergreen)]
    url = f"http://127.0.0.1:{port}"
    with process(args, ready_url=f"{url}/healthz", cwd=tmp_path):
        flow = httpx.post(f"{url}/v1/flows", json={"ast": {"door": 1}}).json()["flow_id"]
        hello = message(text("q", "hi"), action("GENERATE", {"prompt": "q"}, {"response": "r"}))
        out = asyncio.run(start(evergreen, metadata(flow), sent(hello)))
        assert out.code == grpc.StatusCode.OK, out.details
        run = httpx.get(f"{url}/v1/runs/{out.run_id}").json()  # the same run over HTTP
        assert run["status"] == "succeeded"
        step = httpx.get(f"{url}/v1/runs/{out.run_id}/steps").json()[0]
        assert out.text_of("r") == step["output"]["text"] != ""


async def test_a_strict_replay_that_diverges_aborts_with_the_divergence(door: Door) -> None:
    def turn(prompt: str) -> Any:
        return message(
            action("GENERATE", {"prompt": "p"}, {"response": "r"}),
            text("p", prompt),
        )

    recorded = await start(door.port, door.md({"seed": 3}), sent(turn("first words")))
    assert recorded.code == grpc.StatusCode.OK, recorded.details
    replay = {"mode": "strict_replay", "source_run_id": recorded.run_id}
    again = await start(door.port, door.md(replay), sent(turn("other words")))
    assert again.code == grpc.StatusCode.FAILED_PRECONDITION, again.details
    assert again.error["code"] == "REPLAY_MISS"  # no recorded step asked this
    assert (await door.run(again.run_id))["status"] == "failed"


def _ref(node_id: str, uri: str) -> Any:
    from tests.evergreen.upstream import PUBLISHED

    chunk = PUBLISHED.Chunk(ref=uri)
    chunk.metadata.mimetype = "text/plain"
    return PUBLISHED.NodeFragment(id=node_id, chunk_fragment=chunk)


async def test_a_file_ref_is_read_inside_the_run_s_roots_only(door: Door, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "q.txt").write_text("from a file")
    (tmp_path / "secret.txt").write_text("outside")
    run = {"fs_policy": {"roots": [str(root)]}}

    def asking(uri: str) -> Any:
        return message(_ref("q", uri), action("GENERATE", {"prompt": "q"}, {"response": "r"}))

    out = await start(door.port, door.md(run), sent(asking(f"file://{root}/q.txt")))
    assert out.code == grpc.StatusCode.OK, out.details
    (step,) = await door.steps(out.run_id)
    assert step["input"]["prompt"] == "from a file"
    out = await start(door.port, door.md(run), sent(asking(f"file://{tmp_path}/secret.txt")))
    assert out.code == grpc.StatusCode.PERMISSION_DENIED, out.details
    out = await start(door.port, door.md(run), sent(asking("https://example.com/q.txt")))
    assert out.code == grpc.StatusCode.UNIMPLEMENTED and "'https'" in out.details


async def test_a_session_past_its_limits_is_refused_naming_the_limit(db_url: str) -> None:
    settings = make_settings(db_url, evergreen={"max_nodes": 3})
    async for door in _door(Orchestrator(settings)):
        nodes = [text(f"n{i}", "x") for i in range(5)]
        out = await start(door.port, door.md(), sent(message(*nodes)))
        assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, out.details
        assert "max_nodes" in out.details


async def test_plan_is_an_llm_plan_and_a_budget_refusal_is_resource_exhausted(
    door: Door,
) -> None:
    out = await start(
        door.port,
        door.md(),
        sent(
            message(
                text("goal", "Say hello with the echo tool."),
                action("PLAN", {"prompt": "goal"}, {"suggestions": "plan_1"}),
            )
        ),
    )
    assert out.code == grpc.StatusCode.OK, out.details
    (step,) = await door.steps(out.run_id)
    assert step["type"] == "llm_plan"
    (fragment,) = out.fragments("plan_1")
    assert fragment.chunk_fragment.metadata.mimetype == "application/json"
    import json

    assert json.loads(fragment.chunk_fragment.data) == step["output"]
    poor = {"budgets": {"max_tokens_out": 2}}
    out = await start(
        door.port,
        door.md(poor),
        sent(
            message(
                text("q", "hi"),
                action(
                    "GENERATE",
                    {"prompt": "q"},
                    {"response": "r"},
                    configs=[generate_config(max_tokens=50)],
                ),
                action(
                    "GENERATE",
                    {"prompt": "q"},
                    {"response": "r2"},
                    configs=[generate_config(max_tokens=50)],
                ),
            )
        ),
    )
    assert out.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (out.code, out.details)
    assert out.error["code"] == "BUDGET_EXCEEDED"


async def test_shared_nodes_cost_a_session_bound_engine_nothing_twice(tmp_path: Path) -> None:
    """Through the front door to a Kakeya pool: the second turn names the first prompt and
    its answer by id; the engine keeps one session and receives only the new text's tokens."""
    from orchestratord.api.app import create_app
    from tests.pools.test_session_engines import two_replicas
    from worker_adapters.sessions import continuation
    from worker_adapters.tokenizers import SimTokenizer

    sim = SimTokenizer()
    first, question = "User: plan the step\nAssistant:", "\nUser: and the gate?\nAssistant:"
    new_tokens = continuation(sim, question)
    assert new_tokens is not None
    expected = len(sim.encode(first)) + len(new_tokens)
    async with two_replicas("kakeya", tmp_path) as (orch, runtimes):
        server = EvergreenServer(orch, host="127.0.0.1", port=0)
        port = await server.start()
        try:
            transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                flow_id = await make_flow(http, {"shared": 1})
            probes = sum(rt.store.created for rt in runtimes)
            seen: list[int] = []

            async def turns() -> AsyncIterator[Any]:
                yield message(
                    action("GENERATE", {"prompt": "p1"}, {"response": "r1"}), text("p1", first)
                )
                yield message(
                    action("GENERATE", {"prompt": "p2"}, {"response": "r2"}),
                    parent("p2", "p1", "r1", "q2"),
                    text("q2", question),
                )
                for _ in range(500):  # the second turn reached the engine: look, then end
                    sessions = [x for rt in runtimes for x in rt.store.sessions.values()]
                    if sessions and sessions[0].received >= expected:
                        seen.extend(x.received for x in sessions)
                        return
                    await asyncio.sleep(0.01)

            out = await start(port, metadata(flow_id, {"seed": 3}), turns())
            assert out.code == grpc.StatusCode.OK, out.details
            assert sum(rt.store.created for rt in runtimes) == probes + 1  # one session
        finally:
            await server.stop()
    assert seen == [expected]  # the first prompt once, then only the question's tokens


async def test_a_session_s_run_replays_over_http(door: Door) -> None:
    recorded = await start(
        door.port,
        door.md({"seed": 21}),
        sent(
            message(
                text("p", "a story"),
                action(
                    "GENERATE",
                    {"prompt": "p"},
                    {"response": "r"},
                    configs=[generate_config(max_tokens=5, temperature=0.9)],
                ),
            )
        ),
    )
    assert recorded.code == grpc.StatusCode.OK, recorded.details
    (step,) = await door.steps(recorded.run_id)
    for mode in ("replay", "strict_replay"):
        r = await door.http.post(
            f"/v1/flows/{door.flow_id}/runs",
            json={"mode": mode, "source_run_id": recorded.run_id},
        )
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        body = {k: step[k] for k in ("type", "client_token", "input")}
        r = await door.http.post(f"/v1/runs/{run_id}/steps", json=body)
        assert r.status_code == 202, r.text
        again = await wait_status(door.http, r.json()["step_id"], "succeeded", "failed")
        assert again["status"] == "succeeded", again.get("error")
        assert again["output"]["text"] == recorded.text_of("r") != ""


async def test_target_spec_pins_a_pool_or_names_a_model(door: Door) -> None:
    out = await start(
        door.port,
        door.md(),
        sent(
            message(
                text("q", "hi"),
                action("GENERATE", {"prompt": "q"}, {"response": "r1"}, target="local"),
                action("GENERATE", {"prompt": "q"}, {"response": "r2"}, target="no-such-model"),
            )
        ),
    )
    # the pool pins the first; the second names a model no pool serves: refused naming it
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT, out.details
    assert "input.model" in out.details and "no-such-model" in out.details
    steps = await door.steps(out.run_id)
    assert [(s["placement"], s["pool_id"]) for s in steps] == [({"pin": "local"}, "local")]
