"""Bad input never answers 500: it is refused at the edge with 422 ``INVALID_PARAMS`` naming
the field, nothing unreadable is stored, and what was accepted before still reads back.

Bodies are sent as raw JSON text, so that what a JSON encoder would refuse to write (NaN,
Infinity, lone surrogates, integers past 64 bits, deep nesting) reaches the server as a
client could send it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.helpers import make_flow, make_run, parse_sse, submit, wait_status

# One server per backend for the whole module: every test adds its own flow, run, step, fact
# and checkpoint, sends its bad input, and reads back what it added (and the run takes a step).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_client


MAX_INT = 2**53 - 1  # the largest integer the API takes (counts, sizes, durations, cursors)
MAX_DEPTH = 64  # the deepest a JSON value in a request may nest
MAX_COST_USD = 1e9


def deep(levels: int) -> str:
    """JSON text of a value nested ``levels`` levels deep (``[]`` is one level)."""
    return "[" * levels + "]" * levels


def fields_of(r: httpx.Response) -> list[str]:
    return [e["field"] for e in r.json()["details"]["errors"]]


def assert_invalid(r: httpx.Response, field: str, status: int = 422) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == "INVALID_PARAMS", body
    assert field in fields_of(r), body
    assert set(body) == {"code", "message", "retriable", "retry_after_ms", "details"} | {
        "correlation_id"
    }


async def post_raw(client: httpx.AsyncClient, path: str, text: str) -> httpx.Response:
    return await client.post(
        path, content=text.encode(), headers={"content-type": "application/json"}
    )


@dataclass
class Accepted:
    """What a client stored before sending bad input; it must keep reading back."""

    flow_id: str
    run_id: str
    step_id: str
    fact_id: str
    checkpoint_id: str


async def accept_some(client: httpx.AsyncClient) -> Accepted:
    flow_id = await make_flow(client, labels={"team": "a"})
    run_id = await make_run(client, flow_id, budgets={"max_tokens_out": 1000, "max_cost_usd": 5.0})
    r = await submit(client, run_id, token="first", max_tokens=4)
    assert r.status_code == 202, r.text
    step_id = r.json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "seen", "data": {"n": 1}})
    assert r.status_code == 201, r.text
    fact_id = r.json()["fact_id"]
    r = await client.post(f"/v1/runs/{run_id}/checkpoint", json={"state": {"k": 1}})
    assert r.status_code == 201, r.text
    return Accepted(flow_id, run_id, step_id, fact_id, r.json()["checkpoint_id"])


async def assert_reads_back(client: httpx.AsyncClient, a: Accepted) -> None:
    for path in (
        f"/v1/flows/{a.flow_id}",
        f"/v1/runs/{a.run_id}",
        "/v1/runs",
        f"/v1/flows/{a.flow_id}/facts",
        f"/v1/runs/{a.run_id}/steps",
        f"/v1/runs/{a.run_id}/facts",
        f"/v1/runs/{a.run_id}/checkpoints",
        f"/v1/steps/{a.step_id}",
        f"/v1/steps/{a.step_id}/stream",
    ):
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text)
    steps = (await client.get(f"/v1/runs/{a.run_id}/steps")).json()
    if all(s["status"] in ("succeeded", "failed", "cancelled") for s in steps):
        r = await client.get(f"/v1/runs/{a.run_id}/export")
        assert r.status_code == 200, r.text
    run = (await client.get(f"/v1/runs/{a.run_id}")).json()
    assert run["status"] == "running"
    # the run still takes steps, and they run
    r = await submit(client, a.run_id, token=f"after-{len(steps)}", max_tokens=2)
    assert r.status_code == 202, r.text
    await wait_status(client, r.json()["step_id"], "succeeded")


# --- 1. integers beyond the bounds ----------------------------------------------------------

RUNS, FLOWS, FACTS, COMPLETE, GATE = "runs", "flows", "facts", "complete", "gate"
STEP_BUDGETS, STEP_PARAMS = "step budgets", "step params"

INTEGER_CASES = [
    (RUNS, '{"budgets": {"max_tokens_in": 18446744073709551616}}', "budgets.max_tokens_in"),
    (RUNS, '{"budgets": {"max_tokens_out": 9223372036854775808}}', "budgets.max_tokens_out"),
    (RUNS, f'{{"budgets": {{"max_tokens_out": {MAX_INT + 1}}}}}', "budgets.max_tokens_out"),
    (RUNS, '{"budgets": {"max_wall_ms": 9223372036854775808}}', "budgets.max_wall_ms"),
    (RUNS, '{"budgets": {"max_tokens_in": 1e400}}', "budgets.max_tokens_in"),
    (RUNS, '{"fs_policy": {"quota_bytes": 18446744073709551616}}', "fs_policy.quota_bytes"),
    (RUNS, f'{{"fs_policy": {{"quota_files": {2**100}}}}}', "fs_policy.quota_files"),
    (STEP_BUDGETS, '{"max_tokens_out": 9223372036854775808}', "budgets.max_tokens_out"),
    (STEP_BUDGETS, f'{{"max_wall_ms": {MAX_INT + 1}}}', "budgets.max_wall_ms"),
    (STEP_PARAMS, '{"max_tokens": 9223372036854775808}', "input.params.max_tokens"),
    (STEP_PARAMS, '{"top_k": 18446744073709551616}', "input.params.top_k"),
    (STEP_PARAMS, f'{{"top_k": {2**31}}}', "input.params.top_k"),
    (GATE, '{"expr": "true", "wait_ms": 18446744073709551616}', "input.wait_ms"),
    (FACTS, '{"type": "t", "data": {"n": 18446744073709551616}}', "data.n"),
    (COMPLETE, '{"status": "succeeded", "output": {"n": [18446744073709551616]}}', "output.n[0]"),
    (
        FLOWS,
        '{"ast": 1, "tools": [{"name": "t", "parameters": {}, "executor": '
        '{"kind": "http", "url": "http://x", "timeout_ms": 18446744073709551616}}]}',
        "tools.0.executor.http.timeout_ms",
    ),
]


async def send(client: httpx.AsyncClient, a: Accepted, kind: str, text: str) -> httpx.Response:
    """``text`` sent as (or in) the body of a request of ``kind`` against the accepted run."""
    step = '{"type": "llm_call", "client_token": "bad", "input": {"prompt": "hi"'
    path, body = {
        RUNS: (f"/v1/flows/{a.flow_id}/runs", text),
        STEP_BUDGETS: (f"/v1/runs/{a.run_id}/steps", step + '}, "budgets": ' + text + "}"),
        STEP_PARAMS: (f"/v1/runs/{a.run_id}/steps", step + ', "params": ' + text + "}}"),
        GATE: (
            f"/v1/runs/{a.run_id}/steps",
            '{"type": "gate_eval", "client_token": "bad", "input": ' + text + "}",
        ),
        FACTS: (f"/v1/runs/{a.run_id}/facts", text),
        COMPLETE: (f"/v1/runs/{a.run_id}/complete", text),
        FLOWS: ("/v1/flows", text),
    }[kind]
    return await post_raw(client, path, body)


@pytest.mark.parametrize(("kind", "text", "field"), INTEGER_CASES)
async def test_integers_beyond_the_bounds_are_refused(
    client: httpx.AsyncClient, kind: str, text: str, field: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await send(client, a, kind, text), field)
    await assert_reads_back(client, a)


async def test_integers_at_the_bounds_are_stored_and_read_back(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    budgets = {
        "max_tokens_in": MAX_INT,
        "max_tokens_out": MAX_INT,
        "max_wall_ms": MAX_INT,
        "max_cost_usd": MAX_COST_USD,
    }
    run_id = await make_run(
        client,
        a.flow_id,
        budgets=budgets,
        fs_policy={"quota_bytes": MAX_INT, "quota_files": MAX_INT},
    )
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "max",
            "input": {"prompt": "hi", "params": {"max_tokens": 4, "top_k": 2**31 - 1}},
            "budgets": budgets,
        },
    )
    assert r.status_code == 202, r.text
    step_id = r.json()["step_id"]
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert step["status"] == "succeeded", step
    r = await client.post(
        f"/v1/runs/{run_id}/facts", json={"type": "big", "data": {"n": 2**64 - 1, "m": -(2**63)}}
    )
    assert r.status_code == 201, r.text
    assert (await client.get(f"/v1/runs/{run_id}")).json()["budgets"] == budgets
    # stream cursors up to the bound: nothing lies after them, the ended streams close
    for header in (str(2**31), str(2**40), str(MAX_INT)):
        r = await client.get(f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": header})
        assert r.status_code == 200, r.text
        assert parse_sse(r.text)[0] == []
    r = await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    assert r.status_code == 200, r.text
    r = await client.get(f"/v1/runs/{run_id}/stream", params={"after": MAX_INT})
    assert r.status_code == 200, r.text
    r = await client.get(f"/v1/runs/{run_id}/export")
    assert r.status_code == 200, r.text
    bundle = r.json()
    assert (await client.post("/v1/runs:import", json=bundle)).status_code == 200
    # a bundle carries budgets the API would refuse: refused on import too
    bundle["run"]["budgets"]["max_tokens_out"] = 2**63
    assert_invalid(await client.post("/v1/runs:import", json=bundle), "run.budgets.max_tokens_out")
    await assert_reads_back(client, a)


# --- 2. null for a required JSON value ------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "field"),
    [
        (FLOWS, '{"ast": null}', "ast"),
        (FLOWS, '{"ast": null, "labels": {"a": "b"}}', "ast"),
        (FACTS, '{"type": "t", "data": null}', "data"),
    ],
)
async def test_null_for_a_required_json_value_is_refused(
    client: httpx.AsyncClient, kind: str, text: str, field: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await send(client, a, kind, text), field)
    await assert_reads_back(client, a)


async def test_null_inside_a_json_value_is_kept(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    r = await client.post(f"/v1/runs/{a.run_id}/facts", json={"type": "t", "data": [None]})
    assert r.status_code == 201, r.text
    assert r.json()["data"] == [None]
    r = await client.post("/v1/flows", json={"ast": {"x": None}})
    assert r.status_code == 201, r.text
    assert (await client.get(f"/v1/flows/{r.json()['flow_id']}")).json()["ast"] == {"x": None}


# --- 3. deep nesting ------------------------------------------------------------------------

# (kind, body with ``@`` for the deep value, field, levels the field adds around ``@``)
DEPTH_CASES = [
    (FLOWS, '{"ast": @}', "ast", 0),
    (FLOWS, '{"ast": 1, "config": {"a": @}}', "config", 1),
    (FACTS, '{"type": "t", "data": @}', "data", 0),
    (COMPLETE, '{"status": "succeeded", "output": {"a": @}}', "output", 1),
]


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 300, 900])
@pytest.mark.parametrize(("kind", "template", "field", "wrap"), DEPTH_CASES)
async def test_deep_nesting_is_refused(
    client: httpx.AsyncClient, kind: str, template: str, field: str, wrap: int, levels: int
) -> None:
    a = await accept_some(client)
    text = template.replace("@", deep(levels - wrap))
    assert_invalid(await send(client, a, kind, text), field)
    await assert_reads_back(client, a)


@pytest.mark.parametrize(
    ("path", "template", "field"),
    [
        ("checkpoint", '{"state": {"a": @}}', "state"),
        (
            "steps",
            '{"type": "checkpoint", "client_token": "c", "input": {"state": {"a": @}}}',
            "input.state",
        ),
        (
            "steps",
            '{"type": "llm_call", "client_token": "c", '
            '"input": {"prompt": "p", "params": {"json_schema": {"a": @}}}}',
            "input.params.json_schema",
        ),
    ],
)
async def test_deep_nesting_in_run_records_is_refused(
    client: httpx.AsyncClient, path: str, template: str, field: str
) -> None:
    a = await accept_some(client)
    for levels in (MAX_DEPTH + 1, 600):
        text = template.replace("@", deep(levels - 1))
        assert_invalid(await post_raw(client, f"/v1/runs/{a.run_id}/{path}", text), field)
    await assert_reads_back(client, a)


async def test_json_too_deep_to_parse_is_malformed(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    r = await post_raw(client, "/v1/flows", '{"ast": ' + deep(100_000) + "}")
    assert_invalid(r, "body", status=400)
    await assert_reads_back(client, a)


def items_schema(levels: int) -> dict[str, Any]:
    """A JSON Schema of nested arrays, itself ``levels`` levels deep."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def nested_list(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


async def test_nesting_at_the_limit_is_stored_and_read_back(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    r = await client.post(
        "/v1/flows",
        json={
            "ast": nested_list(MAX_DEPTH),
            "tools": [
                {
                    "name": "deep",
                    "parameters": items_schema(MAX_DEPTH),
                    "executor": {"kind": "builtin", "name": "echo"},
                }
            ],
            # config > fact_schemas > the schema
            "config": {"fact_schemas": {"deep": items_schema(MAX_DEPTH - 2)}},
        },
    )
    assert r.status_code == 201, r.text
    flow_id = r.json()["flow_id"]
    run_id = await make_run(client, flow_id)
    r = await client.post(
        f"/v1/runs/{run_id}/facts",
        json={"type": "deep", "data": nested_list(MAX_DEPTH - 3)},
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/runs/{run_id}/facts", json={"type": "deep", "data": nested_list(MAX_DEPTH - 4)}
    )
    assert r.status_code == 422, r.text  # the schema's error, found at the limit
    assert fields_of(r)[0].startswith("data")
    r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "x", "data": deep_obj()})
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "checkpoint", "client_token": "c", "input": {"state": deep_obj()}},
    )
    assert r.status_code == 202, r.text
    await wait_status(client, r.json()["step_id"], "succeeded")
    for path in (f"/v1/flows/{flow_id}", f"/v1/runs/{run_id}/facts", f"/v1/runs/{run_id}/steps"):
        r = await client.get(path)
        assert r.status_code == 200, r.text
    bundle = (await client.get(f"/v1/runs/{run_id}/export")).json()
    assert (await client.post("/v1/runs:import", json=bundle)).status_code == 200
    await assert_reads_back(client, a)


def deep_obj() -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for i in range(MAX_DEPTH - 1):
        value = {f"k{i}": value}
    return value


# --- 4. NUL in text, lone surrogates --------------------------------------------------------

NUL = "\\u0000"
NUL_BODIES = [
    ("steps", f'{{"type": "llm_call", "client_token": "a{NUL}b", "input": {{"prompt": "p"}}}}',
     "client_token"),
    ("facts", f'{{"type": "a{NUL}", "data": 1}}', "type"),
    ("facts", f'{{"type": "a", "data": 1, "schema_uri": "u{NUL}"}}', "schema_uri"),
    ("facts", f'{{"type": "a", "data": 1, "step_id": "s{NUL}"}}', "step_id"),
    ("checkpoint", f'{{"state": {{}}, "step_id": "s{NUL}"}}', "step_id"),
    ("fork", f'{{"checkpoint_id": "c{NUL}"}}', "checkpoint_id"),
    ("steps", '{"type": "llm_call", "client_token": "\\udc00", "input": {"prompt": "p"}}',
     "client_token"),
    ("steps", '{"type": "llm_call", "client_token": "s", "input": {"prompt": "\\ud800"}}',
     "input.prompt"),
    ("facts", '{"type": "a", "data": {"\\ud800": 1}}', "data"),
    ("complete", '{"status": "succeeded", "output": {"x": "\\udfff"}}', "output.x"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "text", "field"), NUL_BODIES)
async def test_nul_and_lone_surrogates_in_text_are_refused(
    client: httpx.AsyncClient, path: str, text: str, field: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await post_raw(client, f"/v1/runs/{a.run_id}/{path}", text), field)
    await assert_reads_back(client, a)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f'{{"mode": "replay", "source_run_id": "r{NUL}"}}', "source_run_id"),
        (f'{{"pool_policy": {{"pin": "p{NUL}"}}}}', "pool_policy.pin"),
        (f'{{"fs_policy": {{"roots": ["/tmp/a{NUL}"]}}}}', "fs_policy.roots.0"),
        ('{"policy": {"rules": [{"id": "\\ud800", "effect": "deny"}]}}', "policy.rules.0.id"),
    ],
)
async def test_nul_in_run_settings_is_refused(
    client: httpx.AsyncClient, text: str, field: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await post_raw(client, f"/v1/flows/{a.flow_id}/runs", text), field)
    await assert_reads_back(client, a)


async def test_lone_surrogates_in_flows_are_refused(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    assert_invalid(await post_raw(client, "/v1/flows", '{"ast": 1, "labels": {"a": "\\ud800"}}'),
                   "labels.a")  # fmt: skip
    text = (
        '{"ast": 1, "tools": [{"name": "t", "parameters": {"x": ["\\udbff"]}, '
        '"executor": {"kind": "builtin", "name": "echo"}}]}'
    )
    assert_invalid(await post_raw(client, "/v1/flows", text), "tools.0.parameters.x[0]")
    text = '{"ast": 1, "config": {"\\udbff": 1}}'
    assert_invalid(await post_raw(client, "/v1/flows", text), "config")
    await assert_reads_back(client, a)


async def test_nul_in_path_and_query_is_refused(client: httpx.AsyncClient) -> None:
    a = await accept_some(client)
    for method, path, field in [
        ("GET", "/v1/runs/a%00b", "path.run_id"),
        ("GET", "/v1/steps/a%00b", "path.step_id"),
        ("GET", "/v1/flows/f%00", "path.flow_id"),
        ("GET", "/v1/flows:by-hash/h%00", "path.content_hash"),
        ("GET", "/v1/steps/a%00b/stream", "path.step_id"),
        ("GET", "/v1/runs/a%00b/export", "path.run_id"),
        ("POST", "/v1/runs/a%00b/cancel", "path.run_id"),
        ("GET", f"/v1/runs/{a.run_id}/facts?type=a%00", "query.type"),
        ("GET", f"/v1/runs/{a.run_id}/facts?after=f%00", "query.after"),
        ("GET", f"/v1/flows/{a.flow_id}/facts?type=%00", "query.type"),
        ("GET", "/v1/runs?status=%00", "query.status"),
        ("GET", "/v1/runs?flow_id=x%00", "query.flow_id"),
        ("GET", "/v1/runs?after=x%00", "query.after"),
    ]:
        r = await client.request(method, path)
        assert_invalid(r, field)
    r = await post_raw(client, "/v1/runs/a%00b/facts", '{"type": "t", "data": 1}')
    assert_invalid(r, "path.run_id")
    await assert_reads_back(client, a)


async def test_nul_inside_json_values_is_kept(client: httpx.AsyncClient) -> None:
    """The JSON columns keep ``\\u0000`` (``json``, not ``jsonb``): values round-trip."""
    a = await accept_some(client)
    data = {"k\x00": ["v\x00", "\x00"]}
    r = await client.post(f"/v1/runs/{a.run_id}/facts", json={"type": "t", "data": data})
    assert r.status_code == 201, r.text
    facts = (await client.get(f"/v1/runs/{a.run_id}/facts", params={"type": "t"})).json()
    assert [f["data"] for f in facts] == [data]
    r = await client.post("/v1/flows", json={"ast": "a\x00", "labels": {"x\x00": "y\x00"}})
    assert r.status_code == 201, r.text
    flow = (await client.get(f"/v1/flows/{r.json()['flow_id']}")).json()
    assert (flow["ast"], flow["labels"]) == ("a\x00", {"x\x00": "y\x00"})
    r = await submit(client, a.run_id, token="nul-prompt", prompt="a\x00b", max_tokens=2)
    assert r.status_code == 202, r.text
    await wait_status(client, r.json()["step_id"], "succeeded")
    await assert_reads_back(client, a)


# --- 5. non-finite floats -------------------------------------------------------------------


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400", "1e300"])
@pytest.mark.parametrize(
    ("kind", "template", "field"),
    [
        (RUNS, '{"budgets": {"max_cost_usd": @}}', "budgets.max_cost_usd"),
        (STEP_BUDGETS, '{"max_cost_usd": @}', "budgets.max_cost_usd"),
        (STEP_PARAMS, '{"temperature": @}', "input.params.temperature"),
    ],
)
async def test_non_finite_floats_are_refused(
    client: httpx.AsyncClient, kind: str, template: str, field: str, number: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await send(client, a, kind, template.replace("@", number)), field)
    await assert_reads_back(client, a)


@pytest.mark.parametrize(
    ("kind", "text", "field"),
    [
        (FLOWS, '{"ast": [NaN]}', "ast[0]"),
        (FACTS, '{"type": "t", "data": {"x": Infinity}}', "data.x"),
        (COMPLETE, '{"status": "failed", "output": {"x": -Infinity}}', "output.x"),
        (COMPLETE, '{"status": "failed", "output": {"x": [1, 1e400]}}', "output.x[1]"),
    ],
)
async def test_non_finite_floats_in_json_values_are_refused(
    client: httpx.AsyncClient, kind: str, text: str, field: str
) -> None:
    a = await accept_some(client)
    assert_invalid(await send(client, a, kind, text), field)
    await assert_reads_back(client, a)


# --- 6. stream cursors ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [str(2**64), str(2**63), str(MAX_INT + 1)])
async def test_stream_cursors_beyond_the_bound_are_refused(
    client: httpx.AsyncClient, value: str
) -> None:
    a = await accept_some(client)
    for path in (f"/v1/steps/{a.step_id}/stream", f"/v1/runs/{a.run_id}/stream"):
        r = await client.get(path, headers={"Last-Event-ID": value})
        assert_invalid(r, "header.Last-Event-ID")
        r = await client.get(path, params={"after": value})
        assert_invalid(r, "query.after")
    # a cursor within the bound resumes as before
    r = await client.get(f"/v1/steps/{a.step_id}/stream", headers={"Last-Event-ID": "0"})
    assert r.status_code == 200, r.text
    events, _ = parse_sse(r.text)
    assert events
    assert events[0].id == "1"
    await assert_reads_back(client, a)


async def test_numeric_strings_are_read_as_numbers(client: httpx.AsyncClient) -> None:
    """Lax on purpose (docs/auth-and-limits.md): "5" is 5, stored and hashed as 5, so the
    two spellings are one request."""
    run_id = await make_run(client)
    body: dict[str, Any] = {"type": "llm_call", "client_token": "c", "input": {"prompt": "hi"}}
    body["input"]["params"] = {"max_tokens": "5"}
    first = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert first.status_code == 202, first.text
    body["input"]["params"] = {"max_tokens": 5}
    again = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert again.status_code == 200 and again.json()["step_id"] == first.json()["step_id"]
    step = (await client.get(f"/v1/steps/{first.json()['step_id']}")).json()
    assert step["input"]["params"]["max_tokens"] == 5
