"""OpenTelemetry spans of a step's life, exported over OTLP/HTTP when an endpoint is set.

Off (``tracing.otlp_endpoint`` unset, the default) this module imports nothing of
OpenTelemetry and every hook below returns after one test of a module global: the hot path
pays a function call per hook, about ten per step and none per token.

On, one trace follows a step from its request to its end (docs/tracing.md)::

    POST /v1/runs/{run_id}/steps     server span of the request (api/request_spans.py)
      step.submit                    the submission rules: policy, budget, admission
        step.place                   the pool chosen
      step.queue_wait                queued -> claimed, emitted at the claim
      engine.call                    the engine request until its last token; first_token
      step.end                       the terminal event and the step's row committed

A step is claimed in another task, often later: its submission remembers the
``step.submit`` span and the time it was queued here, in memory, and the claim parents the
rest of the step on it. A step claimed by another process (or after a restart) has no such
memory there: its ``step.queue_wait`` (from the step's ``created_at``) starts a new trace,
and the step's id ties the two (every span carries ``step_id`` and ``run_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from orchestrator_core.lifecycle import StepStatus
from orchestratord.api.correlation import correlation_id

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import SpanContext, Tracer

    from orchestratord.db.models import Step
    from orchestratord.settings import TracingSettings

REMEMBERED_STEPS = 16384  # queued steps whose submission span is kept; more: oldest forgotten
SHUTDOWN_S = 10.0  # how long stop waits for the last spans to be exported


class Tracing:
    """The tracer while an endpoint is configured, and the queued steps' submission spans.

    The SDK's names are bound here once, at start: the hooks below look nothing up per call.
    """

    def __init__(self, provider: TracerProvider, tracer: Tracer) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Span, Status, StatusCode

        self.provider = provider
        self.tracer = tracer
        # step_id -> (step.submit span, time queued in ns, correlation id); insertion order
        self.queued: dict[str, tuple[SpanContext, int, str | None]] = {}
        self.span_type = Span
        self.status = Status
        self.error = StatusCode.ERROR
        self.current_span = trace.get_current_span
        self.in_context = trace.set_span_in_context
        self.remote = trace.NonRecordingSpan
        self.attach = context.attach
        self.detach = context.detach
        self.root = context.Context

    def annotate(self, span: object, error: str | None, attrs: dict[str, Any]) -> None:
        assert isinstance(span, self.span_type)
        span.set_attributes({k: v for k, v in attrs.items() if v is not None})
        if error is not None:
            span.set_status(self.status(self.error, error))

    def remember(self, span: object, step_id: str) -> None:
        assert isinstance(span, self.span_type)
        queued = self.queued
        queued[step_id] = (span.get_span_context(), time.time_ns(), correlation_id.get())
        if len(queued) > REMEMBERED_STEPS:  # claimed elsewhere, or never: forget the oldest
            del queued[next(iter(queued))]

    @contextlib.contextmanager
    def claimed(self, step: Step) -> Iterator[object]:
        now = time.time_ns()
        remembered = self.queued.pop(step.step_id, None)
        attrs = _attributes(step, {"replica": step.replica_id, "attempt": step.attempts})
        if remembered is not None:
            submit, queued_at, cid = remembered
            if cid is not None:
                attrs["correlation_id"] = cid
            parent = self.in_context(self.remote(submit))
            wait = self.tracer.start_span(
                "step.queue_wait", context=parent, attributes=attrs, start_time=queued_at
            )
        else:  # submitted through another process, or queued again: a trace of its own
            queued_at = int(step.created_at.timestamp() * 1e9) if step.created_at else now
            attrs["submitted_here"] = False
            wait = self.tracer.start_span(
                "step.queue_wait",
                context=self.root(),  # a root, whatever is current in the dispatcher
                attributes=attrs,
                start_time=min(queued_at, now),
            )
            parent = self.in_context(wait)
        wait.end(end_time=now)
        token = self.attach(parent)
        try:
            yield wait
        finally:
            self.detach(token)


ACTIVE: Tracing | None = None


class _Null:
    """What a hook yields when tracing is off: a context manager and a span doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def start(settings: TracingSettings) -> Tracing | None:
    """Start exporting when ``settings`` name an endpoint; returns what ``stop`` takes."""
    global ACTIVE
    if settings.otlp_endpoint is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from orchestratord import __version__

    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": settings.service_name, "service.version": __version__}
        ),
        shutdown_on_exit=False,  # ``stop`` does, with the service
    )
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
    )
    ACTIVE = Tracing(provider, provider.get_tracer("orchestratord", __version__))
    return ACTIVE


async def stop(handle: Tracing | None) -> None:
    """Export what is left (for up to ``SHUTDOWN_S``) and stop making spans."""
    global ACTIVE
    if handle is None:
        return
    if ACTIVE is handle:
        ACTIVE = None
    # The exporter blocks (HTTP with retries): in a thread, so the loop goes on meanwhile;
    # a daemon one, so that an unreachable collector cannot hold the process at exit.
    done = asyncio.get_running_loop().create_future()

    def shutdown() -> None:
        try:
            handle.provider.shutdown()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                done.get_loop().call_soon_threadsafe(_resolve, done)

    threading.Thread(target=shutdown, name="otlp-shutdown", daemon=True).start()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SHUTDOWN_S):
            await done


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# --------------------------------------------------------------------------------------------
# Hooks. Spans are opaque to callers (``object``): they pass them back to ``annotate``.


def _attributes(step: Step | None, attrs: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in attrs.items() if v is not None}
    if step is not None:
        out["run_id"] = step.run_id
        out["step_id"] = step.step_id
        out["kind"] = step.type
        if step.pool_id is not None:
            out["pool"] = step.pool_id
    cid = correlation_id.get()
    if cid is not None:
        out["correlation_id"] = cid
    return out


def span(name: str, step: Step | None = None, **attrs: Any) -> AbstractContextManager[object]:
    """A span around the block, current inside it (children and tasks started there nest
    under it); attributes of ``step`` (run_id, step_id, kind, pool) and ``attrs``."""
    active = ACTIVE
    if active is None:
        return _NULL
    return active.tracer.start_as_current_span(name, attributes=_attributes(step, attrs))


def annotate(span: object, *, error: str | None = None, **attrs: Any) -> None:
    """Attributes learnt during the span (None values are left out); ``error``: the span
    failed with this message."""
    active = ACTIVE
    if active is None or span is _NULL:
        return
    active.annotate(span, error, attrs)


def event(name: str) -> None:
    """An event, now, on the current span (``first_token`` on ``engine.call``)."""
    active = ACTIVE
    if active is None:
        return
    active.current_span().add_event(name)


_TO_CLAIM = (StepStatus.QUEUED.value, StepStatus.RUNNING.value)


def submitted(span: object, step: Step, *, created: bool) -> None:
    """The submission answered: its span names the step; a new step (queued, or started in
    its submission) is remembered until it is claimed, so its queue wait and execution join
    this trace."""
    active = ACTIVE
    if active is None or span is _NULL:
        return
    attrs = {"step_id": step.step_id, "pool": step.pool_id, "created": created}
    active.annotate(span, None, {**attrs, "status": step.status})
    if created and step.status in _TO_CLAIM:  # claimed later, or once this commits
        active.remember(span, step.step_id)


def claimed(step: Step) -> AbstractContextManager[object]:
    """The dispatcher claimed ``step``: emits its ``step.queue_wait`` and, inside the block,
    makes the step's trace current, so the task started there nests under it."""
    active = ACTIVE
    if active is None:
        return _NULL
    return active.claimed(step)
