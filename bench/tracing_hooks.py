"""CPU of the tracing hooks one llm_call step passes, off and on, without a server.

Calls the hooks of ``orchestratord.tracing`` in the order a step passes them (the request
span of the step POST, ``step.submit`` with ``step.place`` inside, the claim with its
``step.queue_wait``, ``engine.call`` with its ``first_token`` event, ``step.end``, the
request span of the stream GET) and measures CPU per step (``time.process_time``, best of
``--repeat`` batches of ``--steps``):

* ``off``: no endpoint, every hook is the null one (what a server with tracing off pays);
* ``spans``: a real SDK tracer whose spans go nowhere (span creation only);
* ``spans + encoding``: also OTLP-encoded by 512, as the exporter's thread does before it
  sends them (the HTTP request itself is not counted).

And the request middleware off: one ASGI layer more per request, against calling the app.

Usage: ``.venv/bin/python bench/tracing_hooks.py [--steps 3000] [--repeat 5]``
Writes ``bench/results/tracing_hooks.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestratord import tracing  # noqa: E402
from orchestratord.api.request_spans import RequestSpanMiddleware  # noqa: E402
from orchestratord.db.models import Step  # noqa: E402

STEP = Step(
    step_id="step_01m83cexvw2ede6dxfr0dwy3yc",
    run_id="run_01m83cextr7awtk6b650qw5c53",
    type="llm_call",
    pool_id="local",
    replica_id="r0",
    status="queued",
    attempts=1,
    created_at=datetime.now(UTC),
)


def one_step() -> None:
    """The hooks of one llm_call step, in order (the request spans as the middleware makes
    them when on)."""
    step = STEP
    with (
        tracing.span("POST /v1/runs/{run_id}/steps"),
        tracing.span("step.submit", run_id=step.run_id, kind=step.type) as submit,
    ):
        with tracing.span("step.place", run_id=step.run_id, kind=step.type) as place:
            tracing.annotate(place, pool=step.pool_id)
        tracing.submitted(submit, step, created=True)
    with tracing.claimed(step):
        pass
    with tracing.span("engine.call", step, replica=step.replica_id) as call:
        tracing.event("first_token")
        tracing.annotate(call, tokens_out=16, stopped=False, error=None)
    with tracing.span("step.end", step, status="succeeded"):
        pass
    with tracing.span("GET /v1/steps/{step_id}/stream"):
        pass


def cpu_per_call(fn: Callable[[], None], n: int, repeat: int) -> float:
    for _ in range(min(n, 300)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
    return best


def use(mode: str) -> None:
    if mode == "off":
        tracing.ACTIVE = None
        return
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    class Encode(SpanProcessor):
        def __init__(self) -> None:
            self.batch: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.batch.append(span)
            if len(self.batch) >= 512:
                encode_spans(self.batch).SerializeToString()
                self.batch = []

    provider = TracerProvider(shutdown_on_exit=False)
    if mode == "spans + encoding":
        provider.add_span_processor(Encode())
    tracing.ACTIVE = tracing.Tracing(provider, provider.get_tracer("bench"))


async def middleware_ns(n: int, repeat: int) -> float:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    layered = RequestSpanMiddleware(app)
    scope = {"type": "http"}
    tracing.ACTIVE = None

    async def timed(call: Any) -> float:
        t0 = time.process_time()
        for _ in range(n):
            await call(scope, None, None)
        return (time.process_time() - t0) / n

    with_mw = min([await timed(layered) for _ in range(repeat)])
    without = min([await timed(app) for _ in range(repeat)])
    return (with_mw - without) * 1e9


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=3000, help="steps per timed batch")
    p.add_argument("--repeat", type=int, default=5, help="batches; the best is kept")
    p.add_argument("--out", type=Path, default=HERE / "results" / "tracing_hooks.json")
    args = p.parse_args()
    result: dict[str, Any] = {"benchmark": "tracing_hooks", "per_step_us": {}}
    for mode in ("off", "spans", "spans + encoding"):
        use(mode)
        us = cpu_per_call(one_step, args.steps, args.repeat) * 1e6
        result["per_step_us"][mode] = round(us, 1)
        print(f"{mode}: {us:.1f} µs CPU per step")
    tracing.ACTIVE = None
    ns = asyncio.run(middleware_ns(args.steps * 20, args.repeat))
    result["middleware_off_ns_per_request"] = round(ns)
    print(f"request middleware, off: {ns:.0f} ns per request")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
