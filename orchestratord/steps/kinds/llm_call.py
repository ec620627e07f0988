"""``llm_call``: a prompt (or messages) sent to an engine replica, streamed token by token.

In a strict_replay run the stream is compared with the recorded step's as it arrives: the
first token that differs is not streamed, and the step ends with ``REPLAY_DIVERGED`` and the
divergence report. A record that stopped for timing (a cancel, a deadline) is reproduced up
to the same token and ends with the same reason.

The step is stopped early, with ``stop_reason: "budget"``, when it reaches the deadline its
wall and cost budgets allow, or when its ``max_tokens`` was clamped by the budget and it
reaches that clamp. Redact rules of the run's policy apply to the tokens before they are
stored or streamed.

What the engine may send, and how long it may take, is bounded by ``engine_limits``
(:mod:`orchestratord.steps.engine_limits`): a token or an output too large, an engine idle too
long, a step with no wall budget past the default deadline end the step with
``ENGINE_ERROR`` naming the reason and the limit; a busy engine's ``Retry-After`` is waited
out and the engine asked again, within the step's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.events import (
    EndEvent,
    ErrorEvent,
    MetricsEvent,
    NarrationEvent,
    Provenance,
    StartedEvent,
    TokenEvent,
)
from contracts.steps import LlmCallInput
from orchestrator_core import clock
from orchestrator_core.breakers import CircuitBreaker
from orchestrator_core.errors import CircuitOpen
from orchestrator_core.generation import LlmInput, llm_input_of
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.placement import narration as placement_narration
from orchestrator_core.policy import PolicySubject, StreamRedactor
from orchestrator_core.replay import ReplayDiverged, StepKey, StreamComparator
from orchestratord import tracing
from orchestratord.db.models import Flow
from orchestratord.engine_requests import generation_request
from orchestratord.policies import policy_of
from orchestratord.replay.steps import load_recorded_stream
from orchestratord.steps.ending import Ending
from orchestratord.steps.engine_limits import OutputMeter, busy_wait_s, watchdog
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.record import StepRecord
from worker_adapters import (
    AdapterError,
    EngineOverLimit,
    EngineUnavailable,
    Finish,
    GenerationRequest,
    Token,
)

log = logging.getLogger("orchestratord.steps")
METRICS_EVERY_S = 1.0


class _ReplayStop(Exception):
    """Raised from the token path of a strict_replay step: ``diverged`` or ``cap``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Usage:
    tokens_in: int
    tokens_out: int
    cost_usd: float | None  # None: the model has no price


@dataclass(frozen=True)
class _Call:
    """How an engine call went."""

    stopped: bool = False  # cancelled, or out of budget
    error: AdapterError | CircuitOpen | None = None
    replay_stop: str | None = None  # a strict_replay step's: "diverged" | "cap"


@dataclass
class _Progress:
    parts: list[str] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    finish: Finish | None = None
    first_at: float | None = None  # monotonic time of the first token
    # monotonic time the engine was last asked for a token (inf while the step waits for its
    # readers, not for the engine): what the idle timeout measures from
    asked_at: float = 0.0


class LlmCall:
    step_type: ClassVar[str] = "llm_call"
    input_model: ClassVar[type[BaseModel]] = LlmCallInput
    engine: ClassVar[bool] = True
    uses_flow: ClassVar[bool] = False
    rerunnable: ClassVar[bool] = True

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        dumped: dict[str, Any] = parsed.model_dump(mode="json", exclude_none=True)
        return dumped

    def subject(
        self, stored: dict[str, Any], *, model: str | None, pool: str | None
    ) -> PolicySubject:
        return PolicySubject(step_type=self.step_type, model=model, pool=pool)

    def llm_input(self, stored: dict[str, Any]) -> LlmInput:
        return llm_input_of(stored)

    def model(self, stored: dict[str, Any]) -> str | None:
        """The input's ``model``, if it names one."""
        model: str | None = stored.get("model")
        return model

    def replay_key(self, stored: dict[str, Any], seed: int) -> StepKey:
        llm = self.llm_input(stored)
        return StepKey(
            type=self.step_type,
            prompt_hash=llm.prompt_hash,
            params_hash=llm.params_hash,
            model=llm.model,
            seed=seed,
        )

    def after_stream(
        self, ctx: StepContext, stored: dict[str, Any], text: str, stop_reason: str
    ) -> dict[str, Any]:
        """Body events and output fields that follow a completed stream (none for a call)."""
        return {}

    async def execute(self, ctx: StepContext) -> Ending:
        return await _LlmRun(self, ctx).run()

    def check_record(self, record: StepRecord) -> None:
        """Its text and token ids are its tokens': checked for every step that streams."""


class _LlmRun:
    """One engine request for one step, from ``started`` to its ending."""

    def __init__(self, kind: LlmCall, ctx: StepContext) -> None:
        assert ctx.pool is not None and ctx.replica is not None and ctx.price is not None
        self.kind = kind
        self.ctx = ctx
        self.pool = ctx.pool
        self.replica = ctx.replica
        self.price = ctx.price
        self.granted = 0
        self.breaker: CircuitBreaker = ctx.services.engine_breakers.get(
            self.pool.breaker_target(self.replica.replica_id)
        )
        self.limits = ctx.services.engine_limits
        self.began = clock.clock.monotonic()
        # the step's deadline: its budget's (the runner stops the step there), else the
        # default one, which ends the call with an error (engine_limits.step_deadline_s)
        self.deadline_s = self.limits.step_deadline_s
        self.default_deadline_at: float | None = self.began + self.deadline_s
        if ctx.deadline_s is not None:
            self.deadline_s, self.default_deadline_at = ctx.deadline_s, None

    async def run(self) -> Ending:
        """Announce the step, call the engine, account for the call, and end the step."""
        step = self.ctx.step
        llm = self.kind.llm_input(step.input)
        model = step.input.get("model") or self.pool.model_name
        determinism = self._determinism(llm, model)
        comparator = await self._recorded_stream()
        self._announce(determinism, model)
        self.granted = self._grant(llm)
        request = generation_request(
            llm, request_id=step.step_id, seed=self.ctx.run.seed, max_tokens=self.granted
        )
        redactor = self._redactor(model)
        progress = _Progress()
        started = clock.clock.monotonic()
        call = await self._call_engine(request, progress, redactor, comparator)
        usage, provenance = self._account(progress, started, determinism)
        output = {"text": "".join(progress.parts), "token_ids": progress.token_ids}
        if call.error is not None and not call.stopped:
            return self._failed(call.error, comparator, output, usage, provenance)
        diverged = call.replay_stop == "diverged"
        ended = None if diverged else self._stop_reason(call, progress, comparator)
        if ended is None:
            assert comparator is not None
            return self._diverged(comparator, output, usage, provenance)
        stop_reason, outcome = ended
        return self._succeeded(stop_reason, outcome, output, usage, provenance)

    def _determinism(self, llm: LlmInput, model: str) -> dict[str, Any]:
        """What the step's tokens are a function of, as provenance names it."""
        caps = self.pool.identity_of(self.replica)
        return {
            "seed": self.ctx.run.seed,
            "prompt_hash": llm.prompt_hash,
            "params_hash": llm.params_hash,
            "engine": caps.get("engine", self.pool.engine),
            "engine_version": caps.get("engine_version"),
            "model_hash": caps.get("model_hash"),
            "pool_id": self.pool.pool_id,
            "replica_id": self.replica.replica_id,
            "model": model,
        }

    async def _recorded_stream(self) -> StreamComparator | None:
        """In a strict_replay run: the recorded step's stream, to compare tokens with."""
        recorded = self.ctx.step.replay_of
        if recorded is None:
            return None
        return StreamComparator(await load_recorded_stream(self.ctx.db, recorded))

    def _announce(self, determinism: dict[str, Any], model: str) -> None:
        """``started``; narrations: where the step was placed and why, and when the model
        has no price."""
        ctx, run = self.ctx, self.ctx.run
        ctx.emit(
            StartedEvent(
                **determinism,
                policy_hash=run.policy_hash,
                price_table=run.price_table,
                replay_of=ctx.step.replay_of,
            )
        )
        if (decision := ctx.step.placement_decision) is not None:
            ctx.emit(NarrationEvent(text=placement_narration(decision)))
        if not self.price.priced:
            ctx.emit(
                NarrationEvent(
                    text=f"model {model!r} on pool {self.pool.pool_id!r} has no price (not in"
                    f" price table {run.price_table}, no price on the pool): its cost is not"
                    " tracked, cost_usd is null"
                )
            )

    def _grant(self, llm: LlmInput) -> int:
        """The step's max_tokens as its budget grants it; a clamp is told on the stream."""
        step = self.ctx.step
        asked = llm.params.max_tokens
        granted = step.max_tokens_granted or asked
        if step.budget_clamped and granted < asked:
            self.ctx.emit(
                NarrationEvent(text=f"max_tokens clamped from {asked} to {granted} by the budget")
            )
        return granted

    def _redactor(self, model: str) -> StreamRedactor | None:
        """The run's policy's redact rules for this step, if any apply."""
        decision = policy_of(self.ctx.run).evaluate(
            PolicySubject(step_type=self.ctx.step.type, model=model, pool=self.pool.pool_id)
        )
        return StreamRedactor(decision.patterns) if decision.patterns else None

    async def _call_engine(
        self,
        request: GenerationRequest,
        progress: _Progress,
        redactor: StreamRedactor | None,
        comparator: StreamComparator | None,
    ) -> _Call:
        """Stream from the engine through the replica's circuit breaker, which learns from
        how the call went."""
        ctx = self.ctx
        try:
            permit = self.breaker.before_call()
        except CircuitOpen as exc:
            return _Call(error=exc)
        if permit.transition is not None:
            ctx.emit_escalation(permit.transition)
        with tracing.span("engine.call", ctx.step, replica=self.replica.replica_id) as span:
            async with self._session(request) as bound:
                call = await self._served(bound, progress, redactor, comparator)
            error = call.error
            tracing.annotate(
                span,
                tokens_out=len(progress.parts),
                stopped=call.stopped,
                error=None if error is None else ctx.services.scrubber.text(error.message),
            )
        # only a replica's own trouble counts (5xx, timeouts, a dead connection): a
        # request it refused (4xx) says nothing about its health
        if call.stopped:
            permit.release()  # cancelled or out of budget: nothing learnt about the replica
            transition = None
        elif isinstance(error, AdapterError) and error.retriable:
            transition = permit.failure(error.message)
        else:
            transition = permit.success()
        if transition is not None:
            ctx.emit_escalation(transition)
        return call

    def _account(
        self, progress: _Progress, started: float, determinism: dict[str, Any]
    ) -> tuple[_Usage, dict[str, Any]]:
        """What the call used and cost (observed in the metrics), and the step's provenance."""
        step, run = self.ctx.step, self.ctx.run
        decode_s = clock.clock.monotonic() - started
        if step.decode_seconds_granted is not None:
            decode_s = min(decode_s, step.decode_seconds_granted)  # stopped there: no more paid
        tokens_out = len(progress.parts)
        tokens_in = progress.finish.tokens_in if progress.finish else 0
        self._observe(progress, started, decode_s, tokens_in, tokens_out)
        cost = self.price.charge(tokens_in, tokens_out, decode_s)
        provenance = {
            **determinism,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost,
            "decode_time_ms": round(decode_s * 1000, 3),
            "price_table": run.price_table,
            "price": self.price.describe(),
            "policy_hash": run.policy_hash,
        }
        return _Usage(tokens_in, tokens_out, cost), provenance

    def _failed(
        self,
        error: AdapterError | CircuitOpen,
        comparator: StreamComparator | None,
        output: dict[str, Any],
        usage: _Usage,
        provenance: dict[str, Any],
    ) -> Ending:
        """End a step whose engine call failed (or whose replica's circuit is open)."""
        if isinstance(error, CircuitOpen):
            body = {**error.body(), "correlation_id": None, "provenance": provenance}
        else:
            code = "POOL_UNAVAILABLE" if isinstance(error, EngineUnavailable) else "ENGINE_ERROR"
            body = {
                "code": code,
                "message": error.message,
                "retriable": error.retriable,
                "retry_after_ms": error.retry_after_ms,
                "details": {
                    "pool_id": self.pool.pool_id,
                    "replica_id": self.replica.replica_id,
                    "tokens_out": usage.tokens_out,
                    **_limit_details(error),
                },
                "correlation_id": None,
                "provenance": provenance,
            }
        if comparator is not None and comparator.finish(None, body["code"]) is not None:
            return self._diverged(comparator, output, usage, provenance)
        return _error(body, output, usage, provenance, "identical" if comparator else None)

    def _stop_reason(
        self, call: _Call, progress: _Progress, comparator: StreamComparator | None
    ) -> tuple[str, str | None] | None:
        """The step's stop reason and replay outcome; None where a strict_replay record went
        on past where this stream ended (a divergence)."""
        ctx = self.ctx
        if call.replay_stop == "cap":  # the record stopped here, for timing
            assert comparator is not None
            return comparator.recorded.stop_reason or "cancelled", "identical"
        if call.stopped:
            stop_reason = "budget" if ctx.budget_stop else "cancelled"
            if comparator is None:
                return stop_reason, None
            if not ctx.budget_stop:
                return stop_reason, "cancelled"  # asked to stop: nothing to compare
        else:
            finish = progress.finish
            stop_reason = finish.stop_reason if finish else "eos"
            clamped = ctx.step.budget_clamped and len(progress.parts) >= self.granted
            if stop_reason == "length" and clamped:
                stop_reason = "budget"
            if comparator is None:
                return stop_reason, None
        if comparator.finish(stop_reason) is not None:
            return None
        return stop_reason, "identical"

    def _succeeded(
        self,
        stop_reason: str,
        outcome: str | None,
        output: dict[str, Any],
        usage: _Usage,
        provenance: dict[str, Any],
    ) -> Ending:
        """End a step whose stream ended (or was stopped): succeeded, or cancelled."""
        ctx, step = self.ctx, self.ctx.step
        if stop_reason != "cancelled":
            output.update(self.kind.after_stream(ctx, step.input, output["text"], stop_reason))
        status = StepStatus.CANCELLED if stop_reason == "cancelled" else StepStatus.SUCCEEDED
        log.info(
            "step ended",
            extra={
                "step_id": step.step_id,
                "run_id": step.run_id,
                "stop_reason": stop_reason,
                "provenance": provenance,
            },
        )
        event = EndEvent(
            stop_reason=stop_reason,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            provenance=Provenance(**provenance),
        )
        return _ending(status, event, stop_reason, output, usage, provenance, outcome)

    def _observe(
        self, progress: _Progress, started: float, decode_s: float, tokens_in: int, tokens_out: int
    ) -> None:
        metrics, pool = self.ctx.services.metrics, self.pool.pool_id
        metrics.placements.labels(pool, self.replica.replica_id).inc()
        if progress.first_at is not None:
            metrics.ttft.labels(pool).observe(progress.first_at - started)
        metrics.decode.labels(pool).observe(decode_s)
        metrics.tokens.labels(pool, "in").inc(tokens_in)
        metrics.tokens.labels(pool, "out").inc(tokens_out)

    @contextlib.asynccontextmanager
    async def _session(self, request: GenerationRequest) -> AsyncIterator[GenerationRequest]:
        """On a session-bound engine: the request with its run's session, held meanwhile."""
        adapter = self.replica.adapter
        if not adapter.session_bound:
            yield request
            return
        step, run = self.ctx.step, self.ctx.run
        sessions = self.ctx.services.sessions
        async with sessions.use(
            step.run_id,
            self.pool.pool_id,
            self.replica.replica_id,
            adapter,
            parent_run_id=(run.forked_from or {}).get("run_id"),
        ) as session:
            yield dataclasses.replace(request, session=session)

    async def _served(
        self,
        request: Any,
        progress: _Progress,
        redactor: StreamRedactor | None,
        comparator: StreamComparator | None,
    ) -> _Call:
        """:meth:`_stream`, and again after the wait a busy engine asks for (429 or 503 with
        ``Retry-After``, nothing streamed), while the wait ends before the step's deadline
        (``engine_limits.busy_retries`` times at most)."""
        call = await self._stream(request, progress, redactor, comparator)
        for _ in range(self.limits.busy_retries):
            if call.error is None:
                break
            wait_s = busy_wait_s(
                call.error.retry_after_ms,
                streamed=bool(progress.parts),
                elapsed_s=clock.clock.monotonic() - self.began,
                deadline_s=self.deadline_s,
            )
            if wait_s is None:
                break
            self.ctx.emit(
                NarrationEvent(
                    text=f"the engine is busy ({call.error.message}): asked again in"
                    f" {wait_s:g} s, as it asked"
                )
            )
            if await self._stopped_within(wait_s):
                return _Call(stopped=True)
            call = await self._stream(request, progress, redactor, comparator)
        return call

    async def _stopped_within(self, wait_s: float) -> bool:
        """Wait ``wait_s``; True if the step was told to stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self.ctx.stop.wait()
        return self.ctx.stop.is_set()

    async def _stream(
        self,
        request: Any,
        progress: _Progress,
        redactor: StreamRedactor | None,
        comparator: StreamComparator | None,
    ) -> _Call:
        """Stream the engine's tokens into the log until it ends, the step must stop, or the
        engine takes too long (a :func:`watchdog` of engine_limits' idle and deadline)."""
        error: AdapterError | None = None
        replay_stop: str | None = None
        stopped = False
        gen = self.replica.adapter.stream(request)
        progress.asked_at = clock.clock.monotonic()
        consume = asyncio.create_task(self._consume(gen, progress, redactor, comparator))
        waiter = asyncio.create_task(self.ctx.stop.wait())
        watch = asyncio.create_task(
            watchdog(lambda: progress.asked_at, self.limits, self.default_deadline_at)
        )
        try:
            done, _ = await asyncio.wait(
                {consume, waiter, watch}, return_when=asyncio.FIRST_COMPLETED
            )
            if consume in done:
                try:
                    consume.result()
                except AdapterError as exc:
                    error = exc
                except _ReplayStop as stop:
                    replay_stop = stop.reason
                    await self._cancel_engine(request)
            else:  # told to stop, or the engine took too long: the call is ended
                stopped = waiter in done
                error = None if stopped else watch.result()
                consume.cancel()
                with contextlib.suppress(asyncio.CancelledError, AdapterError, _ReplayStop):
                    await consume
                await self._cancel_engine(request)
        finally:
            waiter.cancel()
            watch.cancel()
            with contextlib.suppress(Exception):
                await gen.aclose()  # type: ignore[attr-defined]
        return _Call(stopped=stopped, error=error, replay_stop=replay_stop)

    async def _cancel_engine(self, request: Any) -> None:
        with contextlib.suppress(AdapterError):
            await self.replica.adapter.cancel(request.request_id)

    def _diverged(
        self,
        comparator: StreamComparator,
        output: dict[str, Any],
        usage: _Usage,
        provenance: dict[str, Any],
    ) -> Ending:
        """End a strict_replay step at its first difference from the record."""
        step = self.ctx.step
        divergence = comparator.divergence
        assert divergence is not None
        report = {
            "step_id": step.step_id,
            "recorded_step_id": step.replay_of,
            "position": step.position,
            **divergence.as_dict(),
        }
        error = ReplayDiverged(
            f"strict replay diverged from step {step.replay_of} at {divergence.describe()}",
            details={
                "divergence": report,
                "pool_id": self.pool.pool_id,
                "replica_id": self.replica.replica_id,
                "tokens_out": provenance["tokens_out"],
            },
        )
        body = {**error.body(), "correlation_id": None, "provenance": provenance}
        log.warning(
            "strict replay diverged",
            extra={"step_id": step.step_id, "run_id": step.run_id, "divergence": report},
        )
        return _error(body, output, usage, provenance, "diverged")

    async def _consume(
        self,
        gen: Any,
        progress: _Progress,
        redactor: StreamRedactor | None,
        comparator: StreamComparator | None,
    ) -> None:
        steplog = self.ctx.log
        writer = self.ctx.log.writer
        reader = self.ctx.services.pacing.reader_of(self.ctx.step.run_id)
        meter = OutputMeter(self.limits)
        held: deque[Token] = deque()
        began = clock.clock.monotonic()
        next_metrics = began + METRICS_EVERY_S

        def metrics(now: float) -> None:
            ctx = self.ctx
            n = len(progress.parts)
            left = None if ctx.deadline_s is None else max(0.0, ctx.deadline_s - (now - began))
            steplog.emit(
                MetricsEvent(
                    tokens_per_s=round(n / max(now - began, 1e-9), 2),
                    tokens_out=n,
                    tokens_budget_remaining=max(0, self.granted - n),
                    time_budget_remaining_ms=None if left is None else round(left * 1000, 1),
                )
            )

        def emit(token: Token, text: str) -> None:
            if comparator is not None:
                if comparator.at_cap:
                    raise _ReplayStop("cap")
                if comparator.push(text, token.token_id, token.logprob) is not None:
                    raise _ReplayStop("diverged")
            if token.logprob is None:
                steplog.token_nowait(len(progress.parts), text, token.token_id)
            else:
                ranked = (
                    {
                        "top_logprobs": [
                            {"token_id": alt.token_id, "t": alt.text, "logprob": alt.logprob}
                            for alt in token.alternatives
                        ]
                    }
                    if token.alternatives
                    else {}
                )
                steplog.emit(
                    TokenEvent(
                        i=len(progress.parts),
                        t=text,
                        token_id=token.token_id,
                        logprob=token.logprob,
                        **ranked,
                    )
                )
            if not progress.parts:
                progress.first_at = clock.clock.monotonic()
                tracing.event("first_token")
            progress.parts.append(text)
            progress.token_ids.append(token.token_id)
            if comparator is not None and comparator.at_cap:
                raise _ReplayStop("cap")

        async for item in gen:
            if isinstance(item, Token):
                meter.take(item.text)  # a token past engine_limits ends the step unstored
                now = clock.clock.monotonic()
                if now >= next_metrics:
                    metrics(now)
                    next_metrics = now + METRICS_EVERY_S
                if redactor is None:
                    emit(item, item.text)
                else:
                    held.append(item)
                    for text in redactor.push(item.text):
                        emit(held.popleft(), text)
                if writer.over_limit or reader is not None:
                    progress.asked_at = math.inf  # waiting for readers is not the engine's idle
                    if writer.over_limit:
                        await writer.wait_drained()
                    if reader is not None:  # the run's client takes no more: wait for it
                        await reader.room()
                    now = clock.clock.monotonic()
                progress.asked_at = now
            elif isinstance(item, Finish):
                if redactor is not None:
                    for text in redactor.flush():
                        emit(held.popleft(), text)
                if item.truncated:  # the engine dropped session history to fit its window
                    reason = item.engine_reason or item.stop_reason
                    self.ctx.emit(
                        NarrationEvent(
                            text=f"the engine dropped {item.truncated} tokens of the run's "
                            f"session history to fit its window (its stop reason: {reason})"
                        )
                    )
                progress.finish = item
                return


def _limit_details(error: AdapterError) -> dict[str, str]:
    """Which engine limit ended the call, and its setting (none for other errors)."""
    if isinstance(error, EngineOverLimit):
        return {"reason": error.reason, "limit": error.limit}
    return {}


def _error(
    body: dict[str, Any],
    output: dict[str, Any],
    usage: _Usage,
    provenance: dict[str, Any],
    outcome: str | None,
) -> Ending:
    event = ErrorEvent(**body)
    return _ending(StepStatus.FAILED, event, None, output, usage, provenance, outcome, error=body)


def _ending(
    status: StepStatus,
    event: EndEvent | ErrorEvent,
    stop_reason: str | None,
    output: dict[str, Any],
    usage: _Usage,
    provenance: dict[str, Any],
    outcome: str | None,
    *,
    error: dict[str, Any] | None = None,
) -> Ending:
    """A step's end: its event, and the row's columns from what the call used."""
    return Ending(
        status=status,
        event=event,
        output={**output, "stop_reason": stop_reason},
        tokens_in=usage.tokens_in,
        tokens_out=usage.tokens_out,
        cost_usd=usage.cost_usd,
        provenance=provenance,
        error=error,
        replay_outcome=outcome,
    )
