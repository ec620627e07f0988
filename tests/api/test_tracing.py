"""Traces: a step's spans, from its request to its end, exported over OTLP/HTTP to a receiver
run by the test; with tracing off, nothing of the OpenTelemetry SDK is loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the otel extra is not installed",
)

ROOT = Path(__file__).resolve().parents[2]
STEP_POST = "POST /v1/runs/{run_id}/steps"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


@dataclass
class Exported:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[str]
    service: str


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


class Receiver:
    """An OTLP/HTTP traces endpoint: keeps every exported span, decoded."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = (
                    self.path == "/v1/traces"
                    and self.headers["Content-Type"] == "application/x-protobuf"
                )
                if ok:
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver.keep(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def keep(self, request: Any) -> None:
        with self.lock:
            for resource in request.resource_spans:
                res = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for s in scope.spans:
                        self.spans.append(
                            Exported(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                kind=s.kind,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                events=[e.name for e in s.events],
                                service=res.get("service.name", ""),
                            )
                        )

    def of_step(self, step_id: str) -> dict[str, Exported]:
        with self.lock:
            spans = [s for s in self.spans if s.attributes.get("step_id") == step_id]
        by_name = {s.name: s for s in spans}
        assert len(by_name) == len(spans), [s.name for s in spans]  # one of each
        return by_name


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


async def _traced_step(
    db_url: str, receiver: Receiver, correlation: str, *, lose_submission: bool = False
) -> tuple[str, str, int]:
    """Run one llm_call step through a traced server to its end; stop the server (its last
    spans exported). ``lose_submission``: the submission is not remembered, so the claim
    finds nothing of it, as in a process that did not take the request. Returns (run_id,
    step_id, tokens streamed)."""
    settings = make_settings(
        db_url, tracing={"otlp_endpoint": receiver.url, "service_name": "orch-test"}
    )
    orch = Orchestrator(settings)
    await orch.start()
    if lose_submission:
        assert orch.tracing is not None
        orch.tracing.remember = lambda span, step_id: None  # type: ignore[method-assign]
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as live,
        ):
            run_id = await make_run(live)
            r = await live.post(
                f"/v1/runs/{run_id}/steps",
                json={
                    "type": "llm_call",
                    "client_token": "traced",
                    "input": {"prompt": "hello", "params": {"max_tokens": 12}},
                },
                headers={"X-Correlation-Id": correlation},
            )
            assert r.status_code == 202, r.text
            assert r.headers["x-correlation-id"] == correlation
            step_id: str = r.json()["step_id"]
            events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    finally:
        await orch.stop()
    assert events[-1].event == "end"
    return run_id, step_id, sum(1 for e in events if e.event == "token")


async def test_a_step_is_one_trace_from_request_to_end(db_url: str, receiver: Receiver) -> None:
    run_id, step_id, tokens = await _traced_step(db_url, receiver, "trace-me-1")

    spans = receiver.of_step(step_id)
    assert set(spans) == {"step.submit", "step.queue_wait", "engine.call", "step.end"}
    requests = [
        s
        for s in receiver.spans
        if s.name == STEP_POST and s.attributes.get("correlation_id") == "trace-me-1"
    ]
    assert len(requests) == 1
    request = requests[0]
    submit = spans["step.submit"]
    places = [s for s in receiver.spans if s.name == "step.place" and s.parent_id == submit.span_id]
    assert len(places) == 1
    place = places[0]

    # one trace: request -> submit -> place; the queue wait, engine call and end hang on the
    # submission, though they happen in the dispatcher's tasks after the request answered
    chain = [request, submit, place, *(spans[n] for n in ("step.queue_wait", "engine.call"))]
    assert {s.trace_id for s in [*chain, spans["step.end"]]} == {request.trace_id}
    assert request.parent_id == ""
    assert submit.parent_id == request.span_id
    for name in ("step.queue_wait", "engine.call", "step.end"):
        assert spans[name].parent_id == submit.span_id, name

    assert request.kind == SERVER_KIND
    assert request.attributes["http.request.method"] == "POST"
    assert request.attributes["http.route"] == "/v1/runs/{run_id}/steps"
    assert request.attributes["http.response.status_code"] == 202
    assert submit.attributes["correlation_id"] == "trace-me-1"
    assert spans["step.queue_wait"].attributes["correlation_id"] == "trace-me-1"
    assert place.attributes["pool"] == "local"
    for span in spans.values():
        assert span.attributes["step_id"] == step_id
        assert span.attributes["run_id"] == run_id
        assert span.attributes["kind"] == "llm_call"
        assert span.attributes["pool"] == "local"
        assert span.service == "orch-test"

    call = spans["engine.call"]
    assert call.events == ["first_token"]
    assert call.attributes["tokens_out"] == tokens == 12
    assert call.attributes["replica"] == spans["step.queue_wait"].attributes["replica"]
    assert spans["step.end"].attributes["status"] == "succeeded"
    # the queue wait runs from the submission to the claim, before the engine is called
    wait = spans["step.queue_wait"]
    assert submit.start_ns <= wait.start_ns <= wait.end_ns <= call.start_ns
    assert call.end_ns <= spans["step.end"].start_ns


async def test_a_step_claimed_without_its_submission_starts_its_own_trace(
    tmp_path: Path, receiver: Receiver
) -> None:
    """What a process sees of a step submitted through another one: the queue wait (from the
    step's created_at) roots a trace of its own, the step's id ties it to the submission."""
    _, step_id, _ = await _traced_step(
        f"sqlite:///{tmp_path / 'orch.db'}", receiver, "trace-me-2", lose_submission=True
    )
    spans = receiver.of_step(step_id)
    submit, wait = spans["step.submit"], spans["step.queue_wait"]
    assert wait.parent_id == ""
    assert wait.trace_id != submit.trace_id
    assert wait.attributes["submitted_here"] is False
    assert spans["engine.call"].parent_id == wait.span_id
    assert spans["step.end"].parent_id == wait.span_id
    assert spans["engine.call"].trace_id == wait.trace_id


def test_tracing_off_loads_no_sdk_and_makes_no_spans(tmp_path: Path) -> None:
    """Off (no endpoint): a served step loads nothing of the SDK or exporter; every hook is
    the null one. (FastAPI itself imports the OpenTelemetry API, which does nothing here.)"""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        import httpx
        from orchestratord import tracing
        from orchestratord.api.app import create_app
        from orchestratord.runtime import Orchestrator
        from tests.conftest import make_settings
        from tests.helpers import make_run, read_stream, submit

        async def main():
            orch = Orchestrator(make_settings("sqlite:///{tmp_path / "off.db"}"))
            await orch.start()
            app = create_app(orchestrator=orch)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                run_id = await make_run(c)
                step_id = (await submit(c, run_id)).json()["step_id"]
                events = await read_stream(c, f"/v1/steps/{{step_id}}/stream")
            assert events[-1].event == "end", events[-1]
            assert orch.tracing is None and tracing.ACTIVE is None
            assert tracing.span("x") is tracing._NULL
            await orch.stop()

        asyncio.run(main())
        loaded = sorted(
            m for m in sys.modules
            if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto"))
        )
        print("loaded:", loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "loaded: []" in out.stdout, out.stdout
