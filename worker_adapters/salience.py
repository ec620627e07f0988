"""Salience servers (salience.v1, gRPC): sessions with offset-checked appends and logprobs.

With ``request.session`` the prompt (the whole conversation) is tokenized here and read
against the session's record (:func:`~worker_adapters.sessions.tokens_for_prompt`: a prompt
whose text extends the text the record spells keeps the record's tokens): the tokens past the
common prefix are appended, and if the prompt rewrote part of the record the server rewinds to
the common prefix first (``truncating``).
Every Generate states the record's length as ``offset``; the server refuses a mismatch with
FAILED_PRECONDITION, and the adapter then reads the server's tokens (DumpSession), adopts them
as the record and retries once, raising :class:`~worker_adapters.sessions.SessionDrift` if the
retry is refused too. A NOT_FOUND session is reopened and refilled with those tokens once, then
:class:`~worker_adapters.sessions.SessionLost`. Without a session each request gets a one-shot
session, closed afterwards.

With ``request.logprobs`` every generated token carries its logprob; an adapter built with
``top_logprobs=k`` yields :class:`~worker_adapters.base.RankedToken` with the k most likely
``alternatives`` at each position. The protocol carries no seed: output is a function of the
session's tokens and the sampling parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]
from pydantic import Field

from contracts.protos import load
from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    GenerationRequest,
    Health,
    RankedToken,
    Token,
    TokenAlternative,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.grpc_sessions import GrpcSessionAdapter, SessionOptions, session_variant
from worker_adapters.registry import EngineDefaults, ReplicaConfig
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import SessionDrift, SessionFinish, SessionLost, common_prefix
from worker_adapters.stops import StopMatcher
from worker_adapters.tokenizers import PieceDecoder, Tokenizer

_REASONS = {"FINISH_REASON_EOS": "eos", "FINISH_REASON_LENGTH": "length"}
_REASONS["FINISH_REASON_STOP_STRING"] = "stop"


@dataclass(frozen=True)
class _Plan:
    offset: int
    truncating: bool
    append: list[int]


class SalienceAdapter(GrpcSessionAdapter):
    kind = "salience"
    engine_label = "salience server"

    def __init__(
        self,
        *,
        target: str,
        tokenizer: Tokenizer,
        model: str,
        top_logprobs: int = 0,
        stop_token_ids: tuple[int, ...] | None = None,
        model_hash: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            target=target,
            tokenizer=tokenizer,
            model=model,
            pb=load().salience,
            model_hash=model_hash,
            timeout_s=timeout_s,
        )
        self._top_logprobs = top_logprobs
        self._stops = tokenizer.eos_token_ids if stop_token_ids is None else stop_token_ids
        self._caps: Capabilities | None = None

    def _new_stub(self, channel: Any) -> Any:
        return load().salience_grpc.SalienceStub(channel)

    async def _unary(self, method: str, message: str, **fields: Any) -> Any:
        return await self._call(method, getattr(self._pb, message)(**fields))

    async def _open(self, session: EngineSession) -> None:
        opened = await self._unary("OpenSession", "OpenSessionRequest", model=self._model)
        if session.session_id is not None:
            session.rebuilds += 1
        session.rebuilt(opened.session_id, self.target, [])

    async def _plan(self, session: EngineSession, prompt: list[int]) -> _Plan:
        parent, session.fork_of = session.fork_of, None
        if (
            session.session_id is None
            and parent is not None
            and parent.replica == self.target
            and parent.dropped == 0  # positions on the engine are the record's
        ):
            at = common_prefix(parent.history, prompt)
            with contextlib.suppress(AdapterError):  # an optimization: else start anew
                child = await self.fork(parent, at=at)
                assert child.session_id is not None
                session.rebuilt(child.session_id, self.target, child.history)
                session.forked_at = at
        if session.session_id is None or session.replica != self.target:
            await self._open(session)
        if session.verify:  # the server may hold tokens the record lacks: read them
            dump = await self._unary(
                "DumpSession", "DumpSessionRequest", session_id=session.session_id
            )
            session.read_back(list(dump.tokens))
        common = common_prefix(session.history, prompt)
        rewind = common < len(session.history)
        return _Plan(common, rewind, prompt[common:])

    def _generate_request(
        self, session: EngineSession, plan: _Plan, request: GenerationRequest
    ) -> Any:
        pb = self._pb
        end = plan.offset + len(plan.append)
        ranges = (
            [pb.PositionRange(start=end, end=end + request.max_tokens)] if request.logprobs else []
        )
        greedy = request.temperature == 0
        return pb.GenerateRequest(
            session_id=session.session_id,
            append_tokens=plan.append,
            offset=plan.offset,
            truncating=plan.truncating,
            max_tokens=request.max_tokens,
            logprobs_ranges=ranges,
            logprob_top_k=self._top_logprobs if request.logprobs else 0,
            # the proto reads a temperature of 0 as 1.0: greedy is sent as top_k 1
            temperature=1.0 if greedy else request.temperature,
            top_p=request.top_p,
            top_k=1 if greedy else request.top_k,
            stop_token_ids=self._stops,
        )

    async def _generate(
        self, session: EngineSession, request: GenerationRequest, prompt: list[int]
    ) -> AsyncIterator[AdapterEvent]:
        rid = request.request_id
        decoder = PieceDecoder(self._tokenizer)
        matcher = StopMatcher(request.stop)
        sent = generated = 0
        for attempt in (1, 2):
            plan = await self._plan(session, prompt)
            call = self._rpc().Generate(self._generate_request(session, plan, request))
            self._calls.hold(rid, call)
            done: Any = None
            accepted = retry = lost = False
            try:
                async for message in call:
                    if not accepted:  # the server checked the offset and applied the append
                        accepted = True
                        session.rewound(plan.offset)
                        session.appended(plan.append)
                    if message.WhichOneof("event") == "done":
                        done = message.done
                        break
                    token = message.token
                    if token.is_prefill:
                        continue
                    generated += 1
                    session.appended([token.id])
                    for out in matcher.push(self._token(token, decoder)):
                        sent += 1
                        yield out
                    if matcher.stopped:
                        break
            except grpc.aio.AioRpcError as exc:
                error = self._error(exc)
                code = exc.code()
                if not accepted and code == grpc.StatusCode.FAILED_PRECONDITION:
                    session.verify = True
                    if attempt == 2:
                        raise SessionDrift(
                            "the server refused the offset again",
                            expected=plan.offset,
                            actual=len(session.history),
                        ) from exc
                    retry = True
                elif not accepted and isinstance(error, SessionLost) and attempt == 1:
                    retry = lost = True
                else:
                    raise error from exc
            except asyncio.CancelledError:
                if self._calls.cancelled_by_request(rid):
                    return  # cancel(): like every adapter, the stream just ends
                raise
            finally:
                self._calls.release(rid)
                if done is None and not retry:  # the server may have committed more tokens
                    session.verify = True
                    call.cancel()
            if not retry:
                break
            if lost:  # reopen; the next plan refills it from the prompt
                await self._open(session)
        for out in matcher.flush():
            sent += 1
            yield out
        if done is None:
            if not matcher.stopped:
                raise EngineFailure("salience server closed the stream without Done")
            yield SessionFinish("stop", len(prompt), sent, "stop_string", 0, session.history_length)
            return
        reason = self._pb.GenerateDone.FinishReason.Name(done.finish_reason)
        if reason not in _REASONS:
            raise AdapterError(f"salience server ended the generation: {reason}", retriable=True)
        if done.completion_tokens != generated:
            session.verify = True
            raise SessionDrift(
                "generated tokens", expected=generated, actual=done.completion_tokens
            )
        yield SessionFinish(
            _REASONS[reason], done.prompt_tokens, sent, reason, 0, session.history_length
        )

    def _token(self, token: Any, decoder: PieceDecoder) -> Token:
        text = decoder.text(token.id)
        logprob = token.sampled_logprob if token.has_sampled_logprob else None
        if not token.logprobs:
            return Token(text=text, token_id=token.id, logprob=logprob)
        alternatives = tuple(
            TokenAlternative(
                a.id, a.logprob, self._tokenizer.piece(a.id).decode("utf-8", errors="replace")
            )
            for a in token.logprobs
        )
        return RankedToken(text=text, token_id=token.id, logprob=logprob, alternatives=alternatives)

    async def fork(self, session: EngineSession, *, at: int) -> EngineSession:
        """A new server session holding the first ``at`` tokens of ``session`` (ForkSession)."""
        if session.session_id is None or session.replica != self.target:
            raise SessionLost("the session to fork has no server session on this replica")
        forked = await self._unary(
            "ForkSession", "ForkSessionRequest", session_id=session.session_id, at_position=at
        )
        child = self.open_session()
        child.rebuilt(forked.session_id, self.target, session.history[:at])
        return child

    async def health(self) -> Health:
        try:
            await self._unary("GetReadoutManifest", "GetReadoutManifestRequest")
        except EngineUnavailable as exc:
            return Health(live=False, ready=False, detail=exc.message)
        except AdapterError as exc:
            return Health(live=True, ready=False, detail=exc.message)
        return Health(live=True, ready=True)

    async def capabilities(self) -> Capabilities:
        """Asks the server: a session opened and closed gives the model's context length."""
        if self._caps is None:
            opened = await self._unary("OpenSession", "OpenSessionRequest", model=self._model)
            await self._close_quietly(opened.session_id)
            manifest = await self._unary("GetReadoutManifest", "GetReadoutManifestRequest")
            self._caps = Capabilities(
                engine="salience",
                engine_version="salience.v1",
                model=self._model,
                model_hash=self._model_hash,
                context_size=opened.max_model_len,
                features=("stop", "token_ids", "logprobs", "sessions", "fork"),
                extra={
                    "target": self.target,
                    "top_logprobs": self._top_logprobs,
                    "readout_concepts": list(manifest.concepts),
                },
            )
        return self._caps


class SalienceOptions(SessionOptions):
    top_logprobs: int = Field(
        default=0,
        ge=0,
        description="alternatives each token carries when a step asks for logprobs",
    )


def _build(
    replica: ReplicaConfig, options: SalienceOptions, defaults: EngineDefaults
) -> SalienceAdapter:
    return SalienceAdapter(**options.session_args(replica), top_logprobs=options.top_logprobs)


VARIANT = session_variant(SalienceAdapter, SalienceOptions, _build, example_port=50052)
