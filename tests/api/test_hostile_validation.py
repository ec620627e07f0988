"""Client regexes, globs and JSON Schemas that would freeze the server, against a real
``serve --engine sim``: each is refused where it is declared, or run in linear time, or
bounded, while a ``/healthz`` poller in its own process sees the server answer (issue 41's
figures, before: 109 s for a tool pattern, 6.2 s for a fact schema's, 2-3 s for a redact
pattern, 6.4 s for an fs deny glob, 5.3 s for a ``$ref``-doubling schema, 14 s for
``uniqueItems`` over objects, 10.8 s and a 4.8 MB answer for 200,000 invalid keys)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile import Server, poller, serve

pytestmark = pytest.mark.slow

CATASTROPHIC = "^(a+)+$"  # backtracks 2**n times on n a's and a b in Python's re


@dataclass
class Client:
    server: Server
    http: httpx.Client
    files: Path

    def flow(self, tools: list[dict[str, Any]] | None = None, **config: Any) -> httpx.Response:
        body = {"ast": {"test": "hostile"}, "tools": tools or [], "config": config}
        return self.http.post("/v1/flows", json=body)

    def run(self, flow_id: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/v1/flows/{flow_id}/runs", json={"seed": 1, **body})

    def created(self, r: httpx.Response, key: str) -> str:
        assert r.status_code in (200, 201), r.text
        return str(r.json()[key])

    def step(self, run_id: str, token: str, kind: str, **inp: Any) -> httpx.Response:
        body = {"type": kind, "client_token": token, "input": inp}
        return self.http.post(f"/v1/runs/{run_id}/steps", json=body)

    def ended(self, r: httpx.Response) -> dict[str, Any]:
        assert r.status_code == 202, r.text
        step_id = r.json()["step_id"]
        self.http.get(f"/v1/steps/{step_id}/stream")  # closes after the step's end
        body: dict[str, Any] = self.http.get(f"/v1/steps/{step_id}").json()
        return body


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    tmp = tmp_path_factory.mktemp("hostile-validation")
    files = tmp / "files"
    files.mkdir()
    env = {"ORCHESTRATORD_FS__ALLOWED_ROOTS": str(files)}
    with (
        serve(tmp, "--engine", "sim", env=env) as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        yield Client(server, http, files)


def settle(server: Server) -> None:
    """Until the server's CPU falls idle (a tenth of a second under 10 ms of it), and at
    least 0.3 s: what a request left running still counts, and the poller gets its probes."""
    time.sleep(0.2)
    last = server.cpu_s()
    for _ in range(100):
        time.sleep(0.1)
        now = server.cpu_s()
        if now - last < 0.01:
            return
        last = now


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    executor = {"kind": "builtin", "name": "echo"}
    return {"name": "t", "description": "echo", "executor": executor, "parameters": parameters}


def string_schema(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}


def refused_field(r: httpx.Response) -> str:
    assert r.status_code in (413, 422), r.text
    details = r.json()["details"]
    return str(details.get("field") or details["errors"][0]["field"])


def test_a_catastrophic_tool_pattern_runs_in_linear_time(client: Client) -> None:
    flow_id = client.created(client.flow([tool(string_schema(CATASTROPHIC))]), "flow_id")
    run_id = client.created(client.run(flow_id), "run_id")
    with poller(client.server.url) as probes:
        r = client.step(run_id, "p1", "tool_call", tool="t", args={"s": "a" * 100_000 + "b"})
        ok = client.step(run_id, "p2", "tool_call", tool="t", args={"s": "a" * 100_000})
        settle(client.server)
    probes.report.check("a catastrophic tool pattern")
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "TOOL_ARGS_INVALID"
    assert [e["pointer"] for e in r.json()["details"]["errors"]] == ["/s"]
    assert client.ended(ok)["status"] == "succeeded"


def test_a_tool_pattern_re2_cannot_run_is_refused_at_flow_creation(client: Client) -> None:
    r = client.flow([tool(string_schema("^(a+)(?=b)"))])
    assert refused_field(r) == "tools[0].parameters.properties.s.pattern"
    assert "RE2" in r.json()["message"]


def test_a_catastrophic_fact_schema_pattern_runs_in_linear_time(client: Client) -> None:
    flow_id = client.created(
        client.flow(fact_schemas={"n": string_schema(CATASTROPHIC)}), "flow_id"
    )
    run_id = client.created(client.run(flow_id), "run_id")
    with poller(client.server.url) as probes:
        r = client.http.post(
            f"/v1/runs/{run_id}/facts", json={"type": "n", "data": {"s": "a" * 100_000 + "b"}}
        )
        settle(client.server)
    probes.report.check("a catastrophic fact schema pattern")
    assert refused_field(r) == "data.s"
    refused = client.flow(fact_schemas={"n": string_schema(r"(a)\1")})
    assert refused_field(refused) == "config.fact_schemas.n.properties.s.pattern"


def test_a_catastrophic_redact_pattern_runs_in_linear_time(client: Client) -> None:
    flow_id = client.created(client.flow([tool({"type": "object"})]), "flow_id")
    rules = [{"id": "r", "effect": "redact", "pattern": "(a+)+$"}]
    run_id = client.created(client.run(flow_id, policy={"rules": rules}), "run_id")
    with poller(client.server.url) as probes:
        r = client.step(run_id, "r1", "tool_call", tool="t", args={"s": "a" * 20_000 + "b"})
        step = client.ended(r)
        settle(client.server)
    probes.report.check("a catastrophic redact pattern")
    assert step["status"] == "succeeded", step
    lookbehind = [{"id": "r", "effect": "redact", "pattern": "(?<=password=)\\S+"}]
    assert refused_field(client.run(flow_id, policy={"rules": lookbehind})) == (
        "policy.rules[0].pattern"
    )


def test_an_fs_deny_glob_of_many_stars_matches_in_linear_time(client: Client) -> None:
    flow_id = client.created(client.flow(), "flow_id")
    root = client.files / "glob"
    root.mkdir()
    policy = {"roots": [str(root)], "deny": ["**a**a**a**a**a**a**b"]}
    run_id = client.created(client.run(flow_id, fs_policy=policy), "run_id")
    with poller(client.server.url) as probes:
        wrote = client.ended(
            client.step(run_id, "f1", "fs_op", op="write", path="a" * 200, content="x")
        )
        denied = client.ended(
            client.step(run_id, "f2", "fs_op", op="write", path="a" * 199 + "b", content="x")
        )
        settle(client.server)
    probes.report.check("an fs deny glob of many stars")
    assert wrote["status"] == "succeeded", wrote
    assert denied["error"]["details"]["reason"] == "denied", denied


def test_a_ref_doubling_schema_is_refused_at_flow_creation(client: Client) -> None:
    depth = 16
    defs: dict[str, Any] = {f"a{depth}": {"type": "string"}}
    for i in range(depth):
        ref = {"$ref": f"#/$defs/a{i + 1}"}
        defs[f"a{i}"] = {"allOf": [ref, dict(ref)]}
    schema = {"type": "object", "$defs": defs, "properties": {"s": {"$ref": "#/$defs/a0"}}}
    with poller(client.server.url) as probes:
        r = client.flow([tool(schema)])
        settle(client.server)
    probes.report.check("a $ref-doubling schema")
    assert refused_field(r) == "tools[0].parameters.$defs.a4"
    assert r.json()["details"]["limit"] == "validation.max_schema_nodes"


def test_unique_items_over_objects_without_max_items_is_refused(client: Client) -> None:
    xs: dict[str, Any] = {"type": "array", "uniqueItems": True}
    r = client.flow([tool({"type": "object", "properties": {"xs": xs}})])
    assert refused_field(r) == "tools[0].parameters.properties.xs.uniqueItems"
    bounded = {"type": "object", "properties": {"xs": {**xs, "maxItems": 1000}}}
    flow_id = client.created(client.flow([tool(bounded)]), "flow_id")
    run_id = client.created(client.run(flow_id), "run_id")
    with poller(client.server.url) as probes:
        r = client.step(
            run_id, "u1", "tool_call", tool="t", args={"xs": [{"k": i} for i in range(3000)]}
        )
        settle(client.server)
    probes.report.check("uniqueItems over 3,000 objects")
    assert r.status_code == 422, r.text
    assert r.json()["details"]["errors"][0]["pointer"] == "/xs"  # too long, checked in linear time


def test_200k_invalid_keys_get_a_bounded_answer(client: Client) -> None:
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    flow_id = client.created(client.flow([tool(schema)]), "flow_id")
    run_id = client.created(client.run(flow_id), "run_id")
    args = {f"k{i}": "x" for i in range(200_000)}
    cpu = client.server.cpu_s()
    with poller(client.server.url) as probes:
        r = client.step(run_id, "k1", "tool_call", tool="t", args=args)
        settle(client.server)
    # Validation runs on a worker thread and stops at validation.deadline_s (2 s); what the
    # loop still does is read the 2.7 MB body: the duplicate-key scan, json and pydantic in
    # the hot route (1.2 s, measured) and the request's hash in the submission (0.6 s). A
    # body that passes its schema stalls the loop as long (p99 1.5 s measured): that is the
    # body's cost, not validation's, and is held to these wider figures here.
    probes.report.check("200,000 invalid keys", p99_s=2.0, max_s=2.5)
    assert client.server.cpu_s() - cpu < 8.0  # 10.8 s of validation alone, before
    assert r.status_code == 422, r.text[:300]
    details = r.json()["details"]
    assert len(details["errors"]) == 100
    assert details["errors_not_listed"] > 0
    assert len(r.content) < 20_000  # 4.8 MB, before
    assert "more" in r.json()["message"]
