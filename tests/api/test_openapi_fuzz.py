"""The committed OpenAPI document, fuzzed: whatever a client sends, valid or not, the server
answers without a 5xx, with the one error body, as the document declares (status, content
type, body schema); and what it stored reads back.

Bounded: a fixed number of deterministic examples (``derandomize``) against a real server on
a loopback port, so the run takes seconds and fails the same way each time. Path ids are
usually those of a flow, run and step made first, so requests reach the code behind them
rather than stopping at a 404.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.result import Err, Ok

from contracts.openapi import PATH as OPENAPI_PATH
from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.servers import serve_app
from tests.conftest import make_settings

EXAMPLES = 150  # per fuzzing test and backend: a few seconds each
ERROR_KEYS = {"code", "message", "retriable", "retry_after_ms", "details", "correlation_id"}
STREAMS = ("/v1/steps/{step_id}/stream", "/v1/runs/{run_id}/stream")
# a fixed list of examples, the same on every run
BOUNDED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


class ThreadServer:
    """An orchestrator and its HTTP server in a thread of their own, so that a synchronous
    property test can call it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fuzzed-server", daemon=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        orch = Orchestrator(self.settings)
        await orch.start()
        try:
            async with serve_app(create_app(orchestrator=orch)) as url:
                self.url = url
                self._ready.set()
                await self._stop.wait()
        finally:
            await orch.stop()

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        assert self.url, "the server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the server did not stop"
        if self._error is not None:
            raise self._error


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ThreadServer]:
    # steps end soon (a fuzzed max_tokens may be large); nothing waits on a slow engine
    settings = make_settings(db_url, sim={"eos_probability": 0.3})
    with ThreadServer(settings) as served:
        yield served


def seed_records(c: httpx.Client, root: Path) -> dict[str, str]:
    """A flow, a run confined to ``root``, an ended step, a fact and a checkpoint."""
    flow = c.post("/v1/flows", json={"ast": {"v": 1}}).json()
    run = c.post(
        f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1, "fs_policy": {"roots": [str(root)]}}
    ).json()
    run_id = run["run_id"]
    step = c.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "llm_call", "client_token": "t", "input": {"prompt": "hi"}},
    ).json()
    for _ in range(500):
        if c.get(f"/v1/steps/{step['step_id']}").json()["status"] == "succeeded":
            break
    else:
        raise AssertionError("the seeded step did not end")
    c.post(f"/v1/runs/{run_id}/facts", json={"type": "t", "data": 1}).raise_for_status()
    cp = c.post(f"/v1/runs/{run_id}/checkpoint", json={"state": {}}).json()
    return {
        "flow_id": flow["flow_id"],
        "content_hash": flow["hash"],
        "run_id": run_id,
        "step_id": step["step_id"],
        "checkpoint_id": cp["checkpoint_id"],
        "pool_id": "local",
    }


SCHEMA = schemathesis.openapi.from_path(OPENAPI_PATH)
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


def operations() -> list[Any]:
    found = list(SCHEMA.get_all_operations())
    assert not [r for r in found if isinstance(r, Err)], found  # every operation loads
    return [r.ok() for r in found if isinstance(r, Ok)]


def coverage_cases() -> list[Any]:
    """Schemathesis' boundary cases of every operation: each limit and one past it, wrong
    types, nulls, unknown fields, unexpected methods; a fixed list."""
    config = SCHEMA.config.generation
    return [
        case
        for operation in operations()
        for case in SCHEMA.iter_coverage_cases(
            operation, generation_modes=MODES, generation_config=config
        )
    ]


def use_known_ids(case: Any, known: dict[str, str]) -> None:
    """Path ids of what exists, unless the case is about a path parameter."""
    if getattr(case.meta.phase.data, "parameter_location", None) == ParameterLocation.PATH:
        return
    for name in list(case.path_parameters or {}):
        if name in known:
            case.path_parameters[name] = known[name]


def send(c: httpx.Client, case: Any, base_url: str) -> str | None:
    """Send a case; what is wrong with the answer (a 5xx, another error body), or None."""
    kwargs = case.as_transport_kwargs(base_url=base_url)
    content = kwargs.get("data")
    try:
        with c.stream(
            kwargs["method"],
            kwargs["url"],
            headers=kwargs.get("headers"),
            params=kwargs.get("params"),
            cookies=kwargs.get("cookies"),
            json=kwargs.get("json") if content is None else None,
            content=content,
        ) as r:
            if case.operation.path in STREAMS and r.status_code == 200:
                return None  # a live stream: its status is the answer; leave it
            r.read()
    except httpx.LocalProtocolError:
        return None  # a header no HTTP client can send (``Bearer `` with its trailing space)
    problem = problem_of(r) or not_as_documented(case, r)
    if problem is None:
        return None
    body = kwargs.get("json", content)
    return (
        f"{problem}: {kwargs['method']} {kwargs['url']} params={kwargs.get('params')} "
        f"body={body!r:.500} -> {r.status_code} {r.content[:500]!r}"
    )


CONFORMANCE = [status_code_conformance, content_type_conformance, response_schema_conformance]


def not_as_documented(case: Any, r: httpx.Response) -> str | None:
    """The status, content type and body as the committed document declares them."""
    try:
        case.validate_response(r, checks=CONFORMANCE)
    except BaseExceptionGroup as group:  # schemathesis' failures: every check that failed
        return "not as documented: " + "; ".join(str(e)[:400] for e in group.exceptions)
    return None


def problem_of(r: httpx.Response) -> str | None:
    if r.status_code >= 500:
        return "5xx"
    if r.status_code >= 400:
        body = orjson.loads(r.read())
        if not isinstance(body, dict) or set(body) != ERROR_KEYS:
            return "not the error body"
        if body["code"] == "INVALID_PARAMS" and not body["details"].get("errors"):
            return "INVALID_PARAMS naming no field"
    return None


def assert_reads_back(c: httpx.Client, known: dict[str, str]) -> None:
    for path in (
        f"/v1/flows/{known['flow_id']}",
        f"/v1/runs/{known['run_id']}",
        f"/v1/steps/{known['step_id']}",
        f"/v1/runs/{known['run_id']}/facts",
        f"/v1/runs/{known['run_id']}/steps",
        f"/v1/runs/{known['run_id']}/checkpoints",
        f"/v1/flows/{known['flow_id']}/facts",
        "/v1/runs",
    ):
        r = c.get(path)
        assert r.status_code == 200, (path, r.text)


# The server's thread draws from the ``random`` module while examples are drawn here, which
# Hypothesis takes for a strategy using it (the coverage cases are drawn by it as well).
@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module:hypothesis.errors.HypothesisDeprecationWarning"
)
def test_boundary_cases_answer_no_5xx(server: ThreadServer, tmp_path: Path) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        known = seed_records(c, tmp_path)
        problems = []
        for case in coverage_cases():
            use_known_ids(case, known)
            if (problem := send(c, case, server.url)) is not None:
                problems.append(problem)
        assert not problems, f"{len(problems)} bad answers:\n" + "\n".join(problems[:20])
        assert_reads_back(c, known)


# The server's thread draws from the ``random`` module while examples are drawn here, which
# Hypothesis takes for a strategy using it.
@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module:hypothesis.errors.HypothesisDeprecationWarning"
)
def test_fuzzed_requests_answer_no_5xx(server: ThreadServer, tmp_path: Path) -> None:
    strategies = [operation.as_strategy(mode) for operation in operations() for mode in MODES]
    with httpx.Client(base_url=server.url, timeout=30) as c:
        known = seed_records(c, tmp_path)

        @BOUNDED
        @given(st.data())
        def fuzz(data: st.DataObject) -> None:
            case = data.draw(st.sampled_from(strategies).flatmap(lambda s: s))
            if data.draw(st.integers(0, 3)):  # mostly: the ids of what exists
                use_known_ids(case, known)
            problem = send(c, case, server.url)
            assert problem is None, problem

        fuzz()
        assert_reads_back(c, known)


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# Values a JSON parser hands over that storage, hashing or encoding may not take.
HOSTILE: list[Any] = [
    2**53,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e300,
    "a\x00b",
    "\ud800",
    None,
    nested(65),
    nested(300),
]


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every value inside a JSON body (containers included, the root excluded)."""
    if isinstance(value, dict | list):
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            yield (*path, key)
            yield from leaves(child, (*path, key))


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module:hypothesis.errors.HypothesisDeprecationWarning"
)
def test_hostile_values_in_valid_requests_answer_no_5xx(
    server: ThreadServer, tmp_path: Path
) -> None:
    """A valid request with one value swapped for a hostile one (a huge integer, NaN, NUL, a
    lone surrogate, null, deep nesting): it gets past the shape checks to the code behind."""
    bodies = [
        operation.as_strategy(GenerationMode.POSITIVE)
        for operation in operations()
        if operation.body
    ]
    with httpx.Client(base_url=server.url, timeout=30) as c:
        known = seed_records(c, tmp_path)

        @BOUNDED
        @given(st.data())
        def fuzz(data: st.DataObject) -> None:
            case = data.draw(st.sampled_from(bodies).flatmap(lambda s: s))
            use_known_ids(case, known)
            paths = list(leaves(case.body)) if isinstance(case.body, dict | list) else []
            if paths:
                where = data.draw(st.sampled_from(paths))
                case.body = replaced(case.body, where, data.draw(st.sampled_from(HOSTILE)))
            # as a client's encoder writes them: NaN, Infinity, \ud800 escapes
            text = json.dumps(case.body, allow_nan=True)
            r = c.request(
                case.method.upper(),
                case.formatted_path,
                content=text.encode(),
                headers={"content-type": "application/json"},
            )
            problem = problem_of(r)
            assert problem is None, f"{problem}: {case.method} {case.formatted_path} {text:.500}"

        fuzz()
        assert_reads_back(c, known)
