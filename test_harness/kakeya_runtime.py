"""A reference Kakeya runtime (kakeya.v1 over gRPC) for tests and local runs.

    .venv/bin/python -m test_harness.kakeya_runtime --port 50051 --engine sim|llama

Tests start it in-process with ``async with serve_kakeya(...) as runtime`` (a real localhost
gRPC server) and arm failures through ``runtime.faults``.

It keeps the schema's rules: sessions are runtime-issued; ids outside the vocabulary are
INVALID_ARGUMENT and leave the history unchanged; unknown, closed and idle-evicted sessions
are NOT_FOUND; a call on a session that is generating is ABORTED (the schema names no code
for it; ABORTED is gRPC's code for a concurrency conflict). At Generate, a history longer than
sink + window loses its oldest tokens after the sink (one HistoryTruncated event, first), and
decoding stops with STOP_REASON_TRUNCATED once the history fills the window. Tokens come from
the engine given the whole history, so equal (history, seed, sampling) give equal tokens
however the history was appended.

The token engines, the session store and the fault hooks here are shared with
``test_harness.salience_runtime``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc  # type: ignore[import-untyped]

from contracts.protos import load
from worker_adapters.base import GenerationRequest, Token
from worker_adapters.llama import default_model_path, engine_seed, open_model
from worker_adapters.sim import VOCAB, SimAdapter
from worker_adapters.tokenizers import SimTokenizer

_R = TypeVar("_R")

Logprobs = tuple[float | None, list[tuple[int, float]]]  # (logprob of the token, top-k)


@dataclass(frozen=True)
class Sampling:
    seed: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class EngineRun(Protocol):
    async def decode(self, limit: int) -> AsyncIterator[int]:
        """Up to ``limit`` token ids continuing the run's tokens."""
        yield 0

    def logprobs(self, position: int, top_k: int) -> Logprobs:
        """Distribution at ``position`` (its token must already be known to the run)."""
        ...


class TokenEngine(Protocol):
    name: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    context_size: int
    kv_bytes_per_token: int

    def run(
        self, tokens: list[int], sampling: Sampling
    ) -> contextlib.AbstractAsyncContextManager[EngineRun]:
        """Hold the engine for one generation over ``tokens`` (already evaluated on entry)."""
        ...


class SimTokenEngine:
    """The sim engine on token ids: a uniform draw over the sim words, seeded by the history.

    Its distribution is therefore uniform over ``VOCAB`` (byte tokens are never drawn).
    """

    name = "sim"
    kv_bytes_per_token = 64

    def __init__(self, *, context_size: int = 8192, tokens_per_s: float = 0.0) -> None:
        # tokens_per_s: the sim's pace (0: as fast as it can; a slower one for tests that
        # must act while a generation streams)
        self._sim = SimAdapter(tokens_per_s=tokens_per_s, eos_probability=0.0)
        tokenizer = SimTokenizer()
        self.vocab_size = tokenizer.vocab_size
        self.eos_token_ids = tokenizer.eos_token_ids
        self.context_size = context_size

    @contextlib.asynccontextmanager
    async def run(self, tokens: list[int], sampling: Sampling) -> AsyncIterator[EngineRun]:
        yield _SimRun(self._sim, list(tokens), sampling)


@dataclass
class _SimRun:
    sim: SimAdapter
    tokens: list[int]
    sampling: Sampling

    async def decode(self, limit: int) -> AsyncIterator[int]:
        request = GenerationRequest(
            request_id=secrets.token_hex(8),
            prompt=",".join(map(str, self.tokens)),
            messages=None,
            seed=self.sampling.seed,
            max_tokens=limit,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
        )
        async for event in self.sim.stream(request):
            if isinstance(event, Token) and event.token_id is not None:
                self.tokens.append(event.token_id)
                yield event.token_id

    def logprobs(self, position: int, top_k: int) -> Logprobs:
        uniform = -math.log(len(VOCAB))
        chosen = None
        if 0 < position < len(self.tokens):
            chosen = uniform if self.tokens[position] < len(VOCAB) else -math.inf
        return chosen, [(i, uniform) for i in range(min(top_k, len(VOCAB)))]


class LlamaTokenEngine:
    """The local GGUF model on token ids; one generation at a time, on its own thread.

    Every call into the model goes to one thread, in order: a caller cancelled while a call
    runs there (a client gone mid-token) releases the slot at once, and the next
    generation's calls wait behind the one still running instead of entering the model
    beside it (two threads in llama.cpp's context crash the process)."""

    name = "llama"

    def __init__(self, *, model_path: str | None = None, context_size: int = 2048) -> None:
        import llama_cpp

        path = model_path or str(default_model_path())
        self._llm: Any = open_model(path, n_ctx=context_size, logits_all=True, verbose=False)
        vocab = self._llm._model.vocab
        self.vocab_size = int(self._llm.n_vocab())
        self.eos_token_ids = tuple(
            i for i in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)
        )
        self.context_size = int(self._llm.n_ctx())
        meta = self._llm.metadata
        layers = int(meta.get("gemma3.block_count", 1))
        self.kv_bytes_per_token = 2 * 2 * layers * int(meta.get("gemma3.embedding_length", 1))
        self._slot = asyncio.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="llama")

    @contextlib.asynccontextmanager
    async def run(self, tokens: list[int], sampling: Sampling) -> AsyncIterator[EngineRun]:
        async with self._slot:
            run = _LlamaRun(self._llm, list(tokens), sampling, self._thread)
            await run.on_thread(run.prefill)
            yield run


@dataclass
class _LlamaRun:
    llm: Any
    tokens: list[int]
    sampling: Sampling
    thread: ThreadPoolExecutor

    async def on_thread(self, call: Callable[[], _R]) -> _R:
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    def prefill(self) -> None:
        self.llm.reset()
        self.llm.set_seed(engine_seed(self.sampling.seed))
        self.llm.eval(self.tokens)

    def _step(self, commit: int | None) -> int:
        if commit is not None:
            self.llm.eval([commit])
        s = self.sampling
        return int(self.llm.sample(temp=s.temperature, top_p=s.top_p, top_k=s.top_k))

    async def decode(self, limit: int) -> AsyncIterator[int]:
        previous: int | None = None
        for _ in range(limit):
            if len(self.tokens) >= self.llm.n_ctx():
                return
            token = await self.on_thread(functools.partial(self._step, previous))
            self.tokens.append(token)
            previous = token
            yield token

    def logprobs(self, position: int, top_k: int) -> Logprobs:
        import numpy as np

        if not 0 < position < len(self.tokens):
            return None, []
        logits = np.asarray(self.llm.scores[position - 1], dtype=np.float64)
        top = float(logits.max())
        logp = logits - top - math.log(float(np.exp(logits - top).sum()))
        best = np.argsort(-logp, kind="stable")[:top_k]
        return float(logp[self.tokens[position]]), [(int(i), float(logp[i])) for i in best]


def make_engine(name: str) -> TokenEngine:
    if name == "llama":
        return LlamaTokenEngine()
    return SimTokenEngine()


@dataclass(eq=False)
class RuntimeSession:
    session_id: str
    tokens: list[int]
    last_used: float
    eos_token_ids: frozenset[int] = frozenset()
    busy: bool = False
    received: int = 0  # token ids that arrived over the wire for this session


class SessionStore:
    """Sessions by id, evicted once idle for ``idle_ttl_s`` by ``clock``."""

    def __init__(self, *, idle_ttl_s: float, clock: Callable[[], float]) -> None:
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self.sessions: dict[str, RuntimeSession] = {}
        self.evicted: list[str] = []
        self.cancelled = 0  # generations the client cancelled while they streamed
        self.created = 0  # sessions created since the store started

    def create(self, tokens: list[int], **fields: Any) -> RuntimeSession:
        session = RuntimeSession(secrets.token_hex(12), list(tokens), self.clock(), **fields)
        self.created += 1
        self.sessions[session.session_id] = session
        return session

    def evict_idle(self) -> None:
        now = self.clock()
        for sid, session in list(self.sessions.items()):
            if not session.busy and now - session.last_used > self.idle_ttl_s:
                del self.sessions[sid]
                self.evicted.append(sid)

    def get(self, session_id: str) -> RuntimeSession | None:
        self.evict_idle()
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_used = self.clock()
        return session

    def pop(self, session_id: str) -> RuntimeSession | None:
        return self.sessions.pop(session_id, None)


@dataclass
class _Failure:
    code: grpc.StatusCode
    method: str | None
    after_tokens: int | None
    remaining: int


@dataclass
class Faults:
    """Failures a test arms on a runtime; each hits the next calls that match it."""

    delay_s: float = 0.0  # slept at the start of every call
    # tokens every new session starts with, as a runtime that inserts its own BOS would
    new_session_tokens: list[int] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _holds: dict[int, asyncio.Event] = field(default_factory=dict)

    def fail_next(
        self,
        count: int,
        code: grpc.StatusCode,
        *,
        method: str | None = None,
        after_tokens: int | None = None,
    ) -> None:
        """Fail ``count`` calls (of ``method``, or any) with ``code``; with ``after_tokens``,
        fail streams once they sent that many tokens."""
        self._failures.append(_Failure(code, method, after_tokens, count))

    def hold(self, after_tokens: int) -> asyncio.Event:
        """Streams pause after ``after_tokens`` tokens until the returned event is set."""
        event = asyncio.Event()
        self._holds[after_tokens] = event
        return event

    def _take(self, method: str, after_tokens: int | None) -> _Failure | None:
        for failure in self._failures:
            matches = failure.method in (None, method) and failure.after_tokens == after_tokens
            if matches and failure.remaining > 0:
                failure.remaining -= 1
                return failure
        return None

    async def before(self, method: str, context: Any) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        failure = self._take(method, None)
        if failure is not None:
            await context.abort(failure.code, f"injected {failure.code.name}")

    async def during(self, method: str, sent: int, context: Any) -> None:
        failure = self._take(method, sent)
        if failure is not None:
            await context.abort(failure.code, f"injected {failure.code.name} after {sent} tokens")
        hold = self._holds.get(sent)
        if hold is not None:
            await hold.wait()


async def open_session(store: SessionStore, session_id: str, context: Any) -> RuntimeSession:
    session = store.get(session_id)
    if session is None:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session {session_id!r}")
    assert session is not None
    return session


async def claim(store: SessionStore, session_id: str, context: Any) -> RuntimeSession:
    session = await open_session(store, session_id, context)
    if session.busy:
        await context.abort(grpc.StatusCode.ABORTED, "session busy: a generation is running")
    return session


async def check_vocabulary(token_ids: Any, vocab_size: int, context: Any) -> None:
    bad = [t for t in token_ids if t >= vocab_size]
    if bad:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"token ids {bad[:5]} outside the vocabulary of {vocab_size}",
        )


class KakeyaService:
    def __init__(
        self, engine: TokenEngine, store: SessionStore, faults: Faults, *, sink: int, window: int
    ) -> None:
        self.pb = load().kakeya
        self.engine = engine
        self.store = store
        self.faults = faults
        self.sink = sink
        self.capacity = sink + window

    async def CreateSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("CreateSession", context)
        await check_vocabulary(request.eos_token_ids, self.engine.vocab_size, context)
        eos = frozenset(request.eos_token_ids)
        session = self.store.create(self.faults.new_session_tokens, eos_token_ids=eos)
        return self.pb.CreateSessionResponse(session_id=session.session_id)

    async def AppendTokens(self, request: Any, context: Any) -> Any:
        await self.faults.before("AppendTokens", context)
        session = await claim(self.store, request.session_id, context)
        await check_vocabulary(request.token_ids, self.engine.vocab_size, context)
        session.tokens.extend(request.token_ids)
        session.received += len(request.token_ids)
        return self.pb.AppendTokensResponse(history_length=len(session.tokens))

    async def CloseSession(self, request: Any, context: Any) -> Any:
        await self.faults.before("CloseSession", context)
        await claim(self.store, request.session_id, context)
        session = self.store.pop(request.session_id)
        assert session is not None
        return self.pb.CloseSessionResponse(final_history_length=len(session.tokens))

    async def GetSessionInfo(self, request: Any, context: Any) -> Any:
        await self.faults.before("GetSessionInfo", context)
        session = self.store.sessions.get(request.session_id)
        idle = self.store.clock() - session.last_used if session is not None else 0.0
        session = await open_session(self.store, request.session_id, context)
        return self.pb.GetSessionInfoResponse(
            history_length=len(session.tokens),
            kv_live_bytes=len(session.tokens) * self.engine.kv_bytes_per_token,
            idle_seconds=idle,
        )

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await self.faults.before("Generate", context)
        session = await claim(self.store, request.session_id, context)
        session.busy = True
        try:
            async for event in self._generate(session, request, context):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            # a call the client cancels ends the handler's generator either way: cancelled
            # at an await, or closed at its yield
            self.store.cancelled += 1
            raise
        finally:
            session.busy = False
            session.last_used = self.store.clock()

    async def _generate(
        self, session: RuntimeSession, request: Any, context: Any
    ) -> AsyncIterator[Any]:
        pb, tokens = self.pb, session.tokens
        started = time.perf_counter()
        if len(tokens) > self.capacity:
            dropped = len(tokens) - self.capacity
            del tokens[self.sink : self.sink + dropped]
            yield pb.GenerateResponse(truncated=pb.HistoryTruncated(dropped_token_count=dropped))
        seed = request.seed if request.HasField("seed") else secrets.randbits(63)
        sampling = Sampling(
            seed=seed,
            temperature=request.temperature if request.HasField("temperature") else 1.0,
            top_p=request.top_p if request.HasField("top_p") else 1.0,
            top_k=request.top_k if request.HasField("top_k") else 0,
        )
        reason = pb.GenerateDone.STOP_REASON_MAX_TOKENS
        count = 0
        async with self.engine.run(list(tokens), sampling) as run:
            prefilled = time.perf_counter()
            if request.max_tokens and len(tokens) >= self.capacity:
                reason = pb.GenerateDone.STOP_REASON_TRUNCATED
            else:
                async for token in run.decode(request.max_tokens):
                    if token in session.eos_token_ids:
                        reason = pb.GenerateDone.STOP_REASON_EOS
                        break
                    tokens.append(token)
                    count += 1
                    yield pb.GenerateResponse(token_id=token)
                    await self.faults.during("Generate", count, context)
                    if len(tokens) >= self.capacity and count < request.max_tokens:
                        reason = pb.GenerateDone.STOP_REASON_TRUNCATED
                        break
        done = pb.GenerateDone(
            stop_reason=reason,
            generated_token_count=count,
            prefill_duration_seconds=prefilled - started,
            total_duration_seconds=time.perf_counter() - started,
        )
        yield pb.GenerateResponse(done=done)


@dataclass
class RunningRuntime:
    address: str
    store: SessionStore
    faults: Faults
    engine: TokenEngine


@contextlib.asynccontextmanager
async def serve_kakeya(
    *,
    engine: TokenEngine | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    sink: int = 4,
    window: int = 4092,
    idle_ttl_s: float = 1800.0,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[RunningRuntime]:
    """Serve a Kakeya runtime until the block ends; yields its address and test hooks."""
    engine = engine or SimTokenEngine()
    store = SessionStore(idle_ttl_s=idle_ttl_s, clock=clock)
    faults = Faults()
    service = KakeyaService(engine, store, faults, sink=sink, window=window)
    async with grpc_server(host, port, sweep=store) as (server, address):
        load().kakeya_grpc.add_RuntimeServiceServicer_to_server(service, server)
        await server.start()
        yield RunningRuntime(address, store, faults, engine)


@contextlib.asynccontextmanager
async def grpc_server(
    host: str, port: int, *, sweep: SessionStore
) -> AsyncIterator[tuple[Any, str]]:
    """A grpc.aio server bound to ``host:port`` (0 picks one) that evicts idle sessions."""
    server = grpc.aio.server()
    bound = server.add_insecure_port(f"{host}:{port}")

    async def sweeper() -> None:
        while True:
            await asyncio.sleep(min(max(sweep.idle_ttl_s / 2, 0.05), 30.0))
            sweep.evict_idle()

    task = asyncio.create_task(sweeper())
    try:
        yield server, f"{host}:{bound}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=None)


def base_parser(prog: str) -> argparse.ArgumentParser:
    """Options both reference runtimes take."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051)
    parser.add_argument("--engine", choices=("sim", "llama"), default="sim")
    parser.add_argument("--idle-ttl-s", type=float, default=1800.0)
    return parser


async def _main(argv: list[str] | None = None) -> None:
    parser = base_parser("test_harness.kakeya_runtime")
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--window", type=int, default=4092)
    args = parser.parse_args(argv)
    async with serve_kakeya(
        engine=make_engine(args.engine),
        host=args.host,
        port=args.port,
        sink=args.sink,
        window=args.window,
        idle_ttl_s=args.idle_ttl_s,
    ) as runtime:
        print(f"kakeya runtime ({runtime.engine.name}) listening on {runtime.address}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
