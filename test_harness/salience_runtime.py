"""A reference Salience runtime (salience.v1 over gRPC) for tests and local runs.

    .venv/bin/python -m test_harness.salience_runtime --port 50052 --engine sim|llama

Tests start it in-process with ``async with serve_salience(...) as runtime`` and arm failures
through ``runtime.faults``.

It keeps the schema's rules: a Generate whose ``offset`` is not the session's length (or,
with ``truncating``, not below it) is FAILED_PRECONDITION; ids outside the vocabulary and
malformed position ranges are INVALID_ARGUMENT; an appended history longer than the model's
context is RESOURCE_EXHAUSTED; a call on a generating session is ABORTED; unknown and
idle-evicted sessions are NOT_FOUND; CloseSession is idempotent. Every check runs before the
session changes, so a rejected call leaves it as it was. The served model is text-only
(images are INVALID_ARGUMENT) and has no concept probes (readout vectors are empty).

The protocol carries no seed: sampling is seeded with ``SEED``, so equal (tokens, sampling
parameters) give equal tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc  # type: ignore[import-untyped]

from contracts.protos import load
from test_harness.kakeya_runtime import (
    EngineRun,
    Faults,
    RunningRuntime,
    Sampling,
    SessionStore,
    SimTokenEngine,
    TokenEngine,
    base_parser,
    check_vocabulary,
    claim,
    grpc_server,
    make_engine,
    open_session,
)

SEED = 0


def _covered(ranges: Any, position: int) -> bool:
    return any(r.start <= position < r.end for r in ranges)


class SalienceService:
    def __init__(
        self, engine: TokenEngine, store: SessionStore, faults: Faults, *, model: str
    ) -> None:
        self.pb = load().salience
        self.engine = engine
        self.store = store
        self.faults = faults
        self.model = model

    async def OpenSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("OpenSession", context)
        if request.model != self.model:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this server serves {self.model!r}, not {request.model!r}",
            )
        session = self.store.create(self.faults.new_session_tokens)
        return self.pb.OpenSessionResponse(
            session_id=session.session_id, max_model_len=self.engine.context_size
        )

    async def CloseSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("CloseSession", context)
        session = self.store.get(request.session_id)
        if session is not None:
            await claim(self.store, request.session_id, context)
            self.store.pop(request.session_id)
        return self.pb.CloseSessionResponse()

    async def ForkSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("ForkSession", context)
        source = await claim(self.store, request.session_id, context)
        at, length = request.at_position, len(source.tokens)
        if at > length:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"at_position {at} is past the {length} tokens"
            )
        fork = self.store.create(source.tokens[:at])
        return self.pb.ForkSessionResponse(session_id=fork.session_id)

    async def GetReadoutManifest(self, request: Any, context: Any) -> Any:
        await self.faults.before("GetReadoutManifest", context)
        return self.pb.ReadoutManifest(dtype="float32")

    async def DumpSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("DumpSession", context)
        session = await open_session(self.store, request.session_id, context)
        return self.pb.DumpSessionResponse(tokens=session.tokens)

    async def _validate(self, session_tokens: list[int], request: Any, context: Any) -> None:
        length = len(session_tokens)
        rewinding = request.truncating and request.offset < length
        if request.offset != length and not rewinding:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"offset {request.offset} does not match the session's {length} tokens"
                + ("" if request.truncating else " (truncating is not set)"),
            )
        await check_vocabulary(request.append_tokens, self.engine.vocab_size, context)
        if request.images:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the served model takes no images"
            )
        for r in [*request.logprobs_ranges, *request.readout_ranges]:
            if r.start >= r.end:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"empty position range [{r.start}, {r.end})"
                )
        after = request.offset + len(request.append_tokens)
        if after > self.engine.context_size:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{after} tokens exceed the model's context of {self.engine.context_size}",
            )

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await self.faults.before("Generate", context)
        session = await claim(self.store, request.session_id, context)
        await self._validate(session.tokens, request, context)
        del session.tokens[request.offset :]
        session.tokens.extend(request.append_tokens)
        session.received += len(request.append_tokens)
        session.busy = True
        try:
            async for event in self._generate(session.tokens, request, context):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            # a call the client cancels ends the handler's generator either way: cancelled
            # at an await, or closed at its yield
            self.store.cancelled += 1
            raise
        finally:
            session.busy = False
            session.last_used = self.store.clock()

    def _token(self, run: EngineRun, request: Any, position: int, token: int, prefill: bool) -> Any:
        event = self.pb.Token(id=token, position=position, is_prefill=prefill)
        if _covered(request.logprobs_ranges, position):
            chosen, top = run.logprobs(position, request.logprob_top_k)
            if chosen is not None:
                event.sampled_logprob = chosen
                event.has_sampled_logprob = True
            event.logprobs.extend(self.pb.TokenLogprob(id=i, logprob=lp) for i, lp in top)
        return self.pb.GenerateEvent(token=event)

    async def _generate(self, tokens: list[int], request: Any, context: Any) -> AsyncIterator[Any]:
        pb = self.pb
        prompt = len(tokens)
        sampling = Sampling(
            seed=SEED,
            temperature=request.temperature or 1.0,
            top_p=request.top_p or 1.0,
            top_k=request.top_k,
        )
        stops = set(request.stop_token_ids) | set(self.engine.eos_token_ids)
        reason = pb.GenerateDone.FINISH_REASON_LENGTH
        count = 0
        async with self.engine.run(list(tokens), sampling) as run:
            for position, token in enumerate(tokens):
                ranges = [*request.logprobs_ranges, *request.readout_ranges]
                if _covered(ranges, position):
                    yield self._token(run, request, position, token, prefill=True)
            budget = min(request.max_tokens, self.engine.context_size - prompt)
            async for token in run.decode(budget):
                if token in stops:
                    reason = pb.GenerateDone.FINISH_REASON_EOS
                    break
                tokens.append(token)
                count += 1
                yield self._token(run, request, len(tokens) - 1, token, prefill=False)
                await self.faults.during("Generate", count, context)
        done = pb.GenerateDone(
            prompt_tokens=prompt,
            completion_tokens=count,
            total_tokens=prompt + count,
            finish_reason=reason,
        )
        yield pb.GenerateEvent(done=done)


@contextlib.asynccontextmanager
async def serve_salience(
    *,
    engine: TokenEngine | None = None,
    model: str = "sim-1",
    host: str = "127.0.0.1",
    port: int = 0,
    idle_ttl_s: float = 1800.0,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[RunningRuntime]:
    """Serve a Salience runtime until the block ends; yields its address and test hooks."""
    engine = engine or SimTokenEngine()
    store = SessionStore(idle_ttl_s=idle_ttl_s, clock=clock)
    faults = Faults()
    service = SalienceService(engine, store, faults, model=model)
    async with grpc_server(host, port, sweep=store) as (server, address):
        load().salience_grpc.add_SalienceServicer_to_server(service, server)
        await server.start()
        yield RunningRuntime(address, store, faults, engine)


async def _main(argv: list[str] | None = None) -> None:
    parser = base_parser("test_harness.salience_runtime")
    parser.add_argument("--model", default=None, help="name clients must open sessions with")
    parser.set_defaults(port=50052)
    args = parser.parse_args(argv)
    engine = make_engine(args.engine)
    async with serve_salience(
        engine=engine,
        model=args.model or engine.name,
        host=args.host,
        port=args.port,
        idle_ttl_s=args.idle_ttl_s,
    ) as runtime:
        print(f"salience runtime ({engine.name}) listening on {runtime.address}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
