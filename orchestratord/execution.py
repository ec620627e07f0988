"""Running one claimed step on one replica: adapter events in, the step's event log out.

In a strict_replay run the stream is compared with the recorded step's as it arrives: the
first token that differs is not streamed, and the step ends with ``REPLAY_DIVERGED`` and the
divergence report. A record that stopped for timing (a cancel, a deadline) is reproduced up
to the same token and ends with the same reason.

The step is stopped early, with ``stop_reason: "budget"``, when it reaches the deadline its
wall and cost budgets allow, or when its ``max_tokens`` was clamped by the budget and it
reaches that clamp. Redact rules of the run's policy apply to the tokens before they are
stored or streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.budgets import Limits, step_deadline_ms
from orchestrator_core.event_order import EventType
from orchestrator_core.generation import llm_input_of
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.policy import PolicySubject, StreamRedactor
from orchestrator_core.pricing import Price
from orchestrator_core.replay import ReplayDiverged, StreamComparator
from orchestratord.db.models import Run, Step
from orchestratord.engine_requests import generation_request
from orchestratord.eventlog import EventWriter, StepLog
from orchestratord.policies import policy_of
from orchestratord.pools import Pool, Replica
from orchestratord.repo.budgets import settle
from orchestratord.repo.replay_steps import load_recorded_stream
from orchestratord.repo.steps import end_interrupted, get_step, settle_run_after_step
from orchestratord.tx import Tx
from worker_adapters import AdapterError, EngineUnavailable, Finish, Token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedStep:
    """Snapshots of a claimed step and its run, plus what the dispatcher resolved."""

    step: Step
    run: Run
    price: Price


class _ReplayStop(Exception):
    """Raised from the token path of a strict_replay step: ``diverged`` or ``cap``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _End:
    provenance: dict[str, Any]
    text: str
    token_ids: list[int | None]


@dataclass
class _Progress:
    parts: list[str] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    finish: Finish | None = None


class Execution:
    def __init__(
        self,
        claimed: ClaimedStep,
        pool: Pool,
        replica: Replica,
        writer: EventWriter,
        on_done: Callable[[Execution], None],
    ) -> None:
        self.claimed = claimed
        self.step_id = claimed.step.step_id
        self.pool = pool
        self.replica = replica
        self.writer = writer
        self.on_done = on_done
        self.cancel_event = asyncio.Event()
        self.budget_stop = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._guarded(), name=f"step-{self.step_id}")

    def request_cancel(self) -> None:
        self.cancel_event.set()

    def _stop_for_budget(self) -> None:
        self.budget_stop = True
        self.cancel_event.set()

    async def _guarded(self) -> None:
        try:
            await self.run()
        except Exception:
            log.exception("step %s: execution failed", self.step_id)
            await self._end_after_failure()
        finally:
            self.on_done(self)

    async def _end_after_failure(self) -> None:
        """The log could not be written (or the code broke): end the step as a restart would,
        so it is not left running."""
        db = self.writer.db
        try:
            async with db.write() as session:
                tx = Tx(session)
                step = await get_step(session, step_id=self.step_id, lock=True)
                if not StepStatus(step.status).terminal:
                    await end_interrupted(
                        tx, step=step, message="the step failed inside orchestratord; see its logs"
                    )
            self.writer.publish(tx.events)
            self.writer.forget(self.step_id)
        except Exception:
            log.exception("step %s: could not be ended; a restart will end it", self.step_id)

    async def run(self) -> None:
        step, run, replica = self.claimed.step, self.claimed.run, self.replica
        caps = self.pool.identity_of(replica)
        inp = step.input
        llm = llm_input_of(inp)
        model = inp.get("model") or self.pool.model_name
        determinism = {
            "seed": run.seed,
            "prompt_hash": llm.prompt_hash,
            "params_hash": llm.params_hash,
            "engine": caps.get("engine", self.pool.engine),
            "engine_version": caps.get("engine_version"),
            "model_hash": caps.get("model_hash"),
            "pool_id": self.pool.pool_id,
            "replica_id": replica.replica_id,
            "model": model,
        }
        comparator = (
            StreamComparator(await load_recorded_stream(self.writer.db, step.replay_of))
            if step.replay_of is not None
            else None
        )
        steplog = StepLog(self.writer, step.run_id, step.step_id)
        steplog.emit_nowait(
            EventType.STARTED,
            {
                **determinism,
                "policy_hash": run.policy_hash,
                "price_table": run.price_table,
                "replay_of": step.replay_of,
            },
        )
        granted = step.max_tokens_granted or llm.params.max_tokens
        request = generation_request(
            llm, request_id=step.step_id, seed=run.seed, max_tokens=granted
        )
        decision = policy_of(run).evaluate(
            PolicySubject(step_type=step.type, model=model, pool=self.pool.pool_id)
        )
        redactor = StreamRedactor(decision.patterns) if decision.patterns else None
        run_limits = Limits.from_dict(run.budgets)
        deadline = step_deadline_ms(
            run=run_limits,
            step=Limits.from_dict(step.budgets),
            run_elapsed_ms=(clock.now() - run.created_at).total_seconds() * 1000,
            decode_seconds=step.decode_seconds_granted,
        )
        timer = (
            asyncio.get_running_loop().call_later(deadline / 1000, self._stop_for_budget)
            if deadline is not None
            else None
        )
        progress = _Progress()
        started = clock.clock.monotonic()
        error: AdapterError | None = None
        replay_stop: str | None = None
        stopped = False
        gen = replica.adapter.stream(request)
        consume = asyncio.create_task(self._consume(gen, steplog, progress, redactor, comparator))
        waiter = asyncio.create_task(self.cancel_event.wait())
        try:
            done, _ = await asyncio.wait({consume, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if consume in done:
                try:
                    consume.result()
                except AdapterError as exc:
                    error = exc
                except _ReplayStop as stop:
                    replay_stop = stop.reason
                    with contextlib.suppress(AdapterError):
                        await replica.adapter.cancel(request.request_id)
            else:
                stopped = True
                consume.cancel()
                with contextlib.suppress(asyncio.CancelledError, AdapterError, _ReplayStop):
                    await consume
                with contextlib.suppress(AdapterError):
                    await replica.adapter.cancel(request.request_id)
        finally:
            waiter.cancel()
            if timer is not None:
                timer.cancel()
            with contextlib.suppress(Exception):
                await gen.aclose()  # type: ignore[attr-defined]
        decode_s = clock.clock.monotonic() - started
        if step.decode_seconds_granted is not None:
            decode_s = min(decode_s, step.decode_seconds_granted)  # stopped there: no more paid
        finish = progress.finish
        tokens_out = len(progress.parts)
        tokens_in = finish.tokens_in if finish else 0
        cost = self.claimed.price.cost(tokens_in, tokens_out, decode_s)
        provenance = {
            **determinism,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost,
            "decode_time_ms": round(decode_s * 1000, 3),
            "price_table": run.price_table,
            "policy_hash": run.policy_hash,
        }
        end = _End(provenance, "".join(progress.parts), progress.token_ids)
        if error is not None and not stopped:
            code = "POOL_UNAVAILABLE" if isinstance(error, EngineUnavailable) else "ENGINE_ERROR"
            body = {
                "code": code,
                "message": error.message,
                "retriable": error.retriable,
                "retry_after_ms": None,
                "details": {
                    "pool_id": self.pool.pool_id,
                    "replica_id": replica.replica_id,
                    "tokens_out": tokens_out,
                },
                "correlation_id": None,
                "provenance": provenance,
            }
            if comparator is not None and comparator.finish(None, code) is not None:
                await self._end_diverged(steplog, comparator, end)
                return
            await self._end_error(steplog, end, body, "identical" if comparator else None)
            return
        if replay_stop == "diverged":
            assert comparator is not None
            await self._end_diverged(steplog, comparator, end)
            return
        outcome = None
        if replay_stop == "cap":
            assert comparator is not None
            stop_reason = comparator.recorded.stop_reason or "cancelled"
            outcome = "identical"
        elif stopped:
            stop_reason = "budget" if self.budget_stop else "cancelled"
            if comparator is not None and self.budget_stop:
                if comparator.finish(stop_reason) is not None:  # the record went on
                    await self._end_diverged(steplog, comparator, end)
                    return
                outcome = "identical"
            elif comparator is not None:
                outcome = "cancelled"  # asked to stop: nothing to compare
        else:
            stop_reason = finish.stop_reason if finish else "eos"
            if stop_reason == "length" and step.budget_clamped and tokens_out >= granted:
                stop_reason = "budget"
            if comparator is not None:
                if comparator.finish(stop_reason) is not None:
                    await self._end_diverged(steplog, comparator, end)
                    return
                outcome = "identical"
        status = StepStatus.CANCELLED if stop_reason == "cancelled" else StepStatus.SUCCEEDED
        await steplog.close(
            EventType.END,
            {
                "stop_reason": stop_reason,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "provenance": provenance,
            },
            self._finalizer(status, end, stop_reason, None, outcome),
        )
        log.info(
            "step ended",
            extra={
                "step_id": step.step_id,
                "run_id": step.run_id,
                "stop_reason": stop_reason,
                "provenance": provenance,
            },
        )

    async def _end_error(
        self, steplog: StepLog, end: _End, body: dict[str, Any], outcome: str | None
    ) -> None:
        await steplog.close(
            EventType.ERROR,
            body,
            self._finalizer(StepStatus.FAILED, end, None, body, outcome),
        )

    async def _end_diverged(
        self, steplog: StepLog, comparator: StreamComparator, end: _End
    ) -> None:
        """End a strict_replay step at its first difference from the record."""
        step = self.claimed.step
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
                "tokens_out": end.provenance["tokens_out"],
            },
        )
        body = {**error.body(), "correlation_id": None, "provenance": end.provenance}
        log.warning(
            "strict replay diverged",
            extra={"step_id": step.step_id, "run_id": step.run_id, "divergence": report},
        )
        await self._end_error(steplog, end, body, "diverged")

    async def _consume(
        self,
        gen: Any,
        steplog: StepLog,
        progress: _Progress,
        redactor: StreamRedactor | None,
        comparator: StreamComparator | None,
    ) -> None:
        writer = self.writer
        held: deque[Token] = deque()

        def emit(token: Token, text: str) -> None:
            if comparator is not None:
                if comparator.at_cap:
                    raise _ReplayStop("cap")
                if comparator.push(text, token.token_id, token.logprob) is not None:
                    raise _ReplayStop("diverged")
            if token.logprob is None:
                steplog.token_nowait(len(progress.parts), text, token.token_id)
            else:
                steplog.emit_nowait(
                    EventType.TOKEN,
                    {
                        "i": len(progress.parts),
                        "t": text,
                        "token_id": token.token_id,
                        "logprob": token.logprob,
                    },
                )
            progress.parts.append(text)
            progress.token_ids.append(token.token_id)
            if comparator is not None and comparator.at_cap:
                raise _ReplayStop("cap")

        async for item in gen:
            if isinstance(item, Token):
                if redactor is None:
                    emit(item, item.text)
                else:
                    held.append(item)
                    for text in redactor.push(item.text):
                        emit(held.popleft(), text)
                if writer.over_limit:
                    await writer.wait_drained()
            elif isinstance(item, Finish):
                if redactor is not None:
                    for text in redactor.flush():
                        emit(held.popleft(), text)
                progress.finish = item
                return

    def _finalizer(
        self,
        status: StepStatus,
        end: _End,
        stop_reason: str | None,
        error: dict[str, Any] | None,
        replay_outcome: str | None,
    ) -> Any:
        step = self.claimed.step
        provenance = end.provenance

        async def finalize(session: AsyncSession) -> None:
            await session.execute(
                sa.update(Step)
                .where(Step.step_id == step.step_id)
                .values(
                    status=status.value,
                    ended_at=clock.now(),
                    output={
                        "text": end.text,
                        "token_ids": end.token_ids,
                        "stop_reason": stop_reason,
                    },
                    tokens_in=provenance["tokens_in"],
                    tokens_out=provenance["tokens_out"],
                    cost_usd=provenance["cost_usd"],
                    provenance=provenance,
                    error=error,
                    replay_outcome=replay_outcome,
                )
                .execution_options(synchronize_session=False)
            )
            await settle(
                session,
                step=step,
                tokens_in=provenance["tokens_in"],
                tokens_out=provenance["tokens_out"],
                cost_usd=provenance["cost_usd"],
            )
            await settle_run_after_step(session, run_id=step.run_id)

        return finalize
