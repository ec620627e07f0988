"""Running one claimed step on one replica: adapter events in, the step's event log out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.event_order import EventType
from orchestrator_core.generation import LlmInput, normalize_llm_input
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import Run, Step
from orchestratord.eventlog import EventWriter, StepLog
from orchestratord.pools import Pool, Replica
from orchestratord.repo.steps import settle_run_after_step
from worker_adapters import AdapterError, EngineUnavailable, Finish, GenerationRequest, Token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedStep:
    step_id: str
    run_id: str
    position: int
    type: str
    input: dict[str, Any]
    seed: int


@dataclass
class _Progress:
    parts: list[str] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    finish: Finish | None = None


def to_request(step: ClaimedStep, llm: LlmInput) -> GenerationRequest:
    p = llm.params
    return GenerationRequest(
        request_id=step.step_id,
        prompt=llm.prompt,
        messages=None
        if llm.messages is None
        else tuple({"role": m.role, "content": m.content} for m in llm.messages),
        seed=step.seed,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        stop=p.stop,
        model=llm.model,
        logprobs=p.logprobs,
        json_schema=p.json_schema,
    )


class Execution:
    def __init__(
        self,
        step: ClaimedStep,
        pool: Pool,
        replica: Replica,
        writer: EventWriter,
        on_done: Callable[[Execution], None],
    ) -> None:
        self.step = step
        self.pool = pool
        self.replica = replica
        self.writer = writer
        self.on_done = on_done
        self.cancel_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._guarded(), name=f"step-{self.step.step_id}")

    def request_cancel(self) -> None:
        self.cancel_event.set()

    async def _guarded(self) -> None:
        try:
            await self.run()
        except Exception:
            log.exception("step %s: execution failed", self.step.step_id)
        finally:
            self.on_done(self)

    async def run(self) -> None:
        step, replica = self.step, self.replica
        caps = self.pool.capabilities
        steplog = StepLog(self.writer, step.run_id, step.step_id)
        steplog.emit_nowait(
            EventType.STARTED,
            {
                "pool_id": self.pool.pool_id,
                "replica_id": replica.replica_id,
                "engine": self.pool.engine,
            },
        )
        inp = step.input
        llm = normalize_llm_input(
            prompt=inp.get("prompt"),
            messages=inp.get("messages"),
            params=inp.get("params"),
            model=inp.get("model"),
        )
        request = to_request(step, llm)
        progress = _Progress()
        started = clock.clock.monotonic()
        error: AdapterError | None = None
        cancelled = False
        gen = replica.adapter.stream(request)
        consume = asyncio.create_task(self._consume(gen, steplog, progress))
        waiter = asyncio.create_task(self.cancel_event.wait())
        try:
            done, _ = await asyncio.wait({consume, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if consume in done:
                try:
                    consume.result()
                except AdapterError as exc:
                    error = exc
            else:
                cancelled = True
                consume.cancel()
                with contextlib.suppress(asyncio.CancelledError, AdapterError):
                    await consume
                with contextlib.suppress(AdapterError):
                    await replica.adapter.cancel(request.request_id)
        finally:
            waiter.cancel()
            with contextlib.suppress(Exception):
                await gen.aclose()  # type: ignore[attr-defined]
        decode_ms = round((clock.clock.monotonic() - started) * 1000, 3)
        finish = progress.finish
        tokens_out = len(progress.parts)
        tokens_in = finish.tokens_in if finish else 0
        provenance = {
            "seed": step.seed,
            "prompt_hash": llm.prompt_hash,
            "params_hash": llm.params_hash,
            "engine": caps.get("engine", self.pool.engine),
            "engine_version": caps.get("engine_version"),
            "model_hash": caps.get("model_hash"),
            "pool_id": self.pool.pool_id,
            "replica_id": replica.replica_id,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": 0.0,
            "decode_time_ms": decode_ms,
        }
        text = "".join(progress.parts)
        if error is not None and not cancelled:
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
            }
            await steplog.close(
                EventType.ERROR,
                body,
                self._finalizer(StepStatus.FAILED, provenance, text, progress, None, body),
            )
            return
        stop_reason = "cancelled" if cancelled else (finish.stop_reason if finish else "eos")
        await steplog.close(
            EventType.END,
            {
                "stop_reason": stop_reason,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "provenance": provenance,
            },
            self._finalizer(
                StepStatus.CANCELLED if cancelled else StepStatus.SUCCEEDED,
                provenance,
                text,
                progress,
                stop_reason,
                None,
            ),
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

    async def _consume(self, gen: Any, steplog: StepLog, progress: _Progress) -> None:
        writer = self.writer
        async for item in gen:
            if isinstance(item, Token):
                payload: dict[str, object] = {
                    "i": len(progress.parts),
                    "t": item.text,
                    "token_id": item.token_id,
                }
                if item.logprob is not None:
                    payload["logprob"] = item.logprob
                steplog.emit_nowait(EventType.TOKEN, payload)
                progress.parts.append(item.text)
                progress.token_ids.append(item.token_id)
                if writer.over_limit:
                    await writer.wait_drained()
            elif isinstance(item, Finish):
                progress.finish = item
                return

    def _finalizer(
        self,
        status: StepStatus,
        provenance: dict[str, Any],
        text: str,
        progress: _Progress,
        stop_reason: str | None,
        error: dict[str, Any] | None,
    ) -> Any:
        step = self.step

        async def finalize(session: AsyncSession) -> None:
            await session.execute(
                sa.update(Step)
                .where(Step.step_id == step.step_id)
                .values(
                    status=status.value,
                    ended_at=clock.now(),
                    output={
                        "text": text,
                        "token_ids": progress.token_ids,
                        "stop_reason": stop_reason,
                    },
                    tokens_in=provenance["tokens_in"],
                    tokens_out=provenance["tokens_out"],
                    cost_usd=provenance["cost_usd"],
                    provenance=provenance,
                    error=error,
                )
            )
            await session.execute(
                sa.update(Run)
                .where(Run.run_id == step.run_id)
                .values(
                    tokens_in_used=Run.tokens_in_used + provenance["tokens_in"],
                    tokens_out_used=Run.tokens_out_used + provenance["tokens_out"],
                    cost_used_usd=Run.cost_used_usd + provenance["cost_usd"],
                    updated_at=clock.now(),
                )
            )
            await settle_run_after_step(session, run_id=step.run_id)

        return finalize
