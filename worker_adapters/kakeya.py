"""Kakeya runtimes (kakeya.v1, gRPC): session-bound generation on raw token ids.

With ``request.session`` the run's engine session is created on first use and then only the
tokens it lacks are appended: the prompt (the whole conversation) is tokenized here, read
against the session's record (:func:`~worker_adapters.sessions.tokens_for_prompt`: a prompt
whose text extends the text the record spells appends the rest of the text's tokens), and the
difference sent. Kakeya histories are append-only, so a prompt that rewrites the recorded past
gets a new session holding the prompt. Every ``history_length`` the runtime reports is checked
against the record; a mismatch recreates the session from the record, and
:class:`~worker_adapters.sessions.SessionDrift` is raised if even that disagrees. Without a
session each request gets a one-shot session, closed afterwards.

The stream ends with a :class:`~worker_adapters.sessions.SessionFinish` that names the
runtime's stop reason (``STOP_REASON_TRUNCATED`` reads as ``length``) and the tokens a
HistoryTruncated event dropped. Kakeya has no fork: :meth:`KakeyaAdapter.fork` creates a
session from a prefix of the parent's record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
from pydantic import Field

from contracts.protos import load
from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    GenerationRequest,
    Health,
    Token,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.grpc_sessions import GrpcSessionAdapter, SessionOptions, session_variant
from worker_adapters.registry import EngineDefaults, ReplicaConfig
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import SessionDrift, SessionFinish, SessionLost, common_prefix
from worker_adapters.stops import StopMatcher
from worker_adapters.tokenizers import PieceDecoder, Tokenizer

_REASONS = {"STOP_REASON_MAX_TOKENS": "length", "STOP_REASON_EOS": "eos"}
_REASONS["STOP_REASON_TRUNCATED"] = "length"  # the window is full: no room for more tokens
_PROBE_SESSION = "health-probe"


class KakeyaAdapter(GrpcSessionAdapter):
    kind = "kakeya"
    engine_label = "kakeya runtime"

    def __init__(
        self,
        *,
        target: str,
        tokenizer: Tokenizer,
        model: str,
        context_size: int,
        eos_token_ids: tuple[int, ...] | None = None,
        model_hash: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            target=target,
            tokenizer=tokenizer,
            model=model,
            pb=load().kakeya,
            model_hash=model_hash,
            timeout_s=timeout_s,
        )
        self._context_size = context_size
        self._eos = tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids

    def _new_stub(self, channel: Any) -> Any:
        return load().kakeya_grpc.RuntimeServiceStub(channel)

    async def _unary(self, method: str, **fields: Any) -> Any:
        return await self._call(method, getattr(self._pb, f"{method}Request")(**fields))

    async def _rebuild(self, session: EngineSession, tokens: list[int]) -> None:
        """Point ``session`` at a new runtime session holding exactly ``tokens``."""
        created = await self._unary(
            "CreateSession", client_label="orchestratord", eos_token_ids=self._eos
        )
        length = 0
        if tokens:
            appended = await self._unary(
                "AppendTokens", session_id=created.session_id, token_ids=tokens
            )
            length = appended.history_length
        if length != len(tokens):
            raise SessionDrift("a recreated session", expected=len(tokens), actual=length)
        old = session.session_id if session.replica == self.target else None
        if session.session_id is not None:
            session.rebuilds += 1
        session.rebuilt(created.session_id, self.target, tokens)
        if old is not None:
            await self._close_quietly(old)

    async def _prepare(self, session: EngineSession, prompt: list[int]) -> None:
        """Make the runtime session hold ``prompt``, sending only the tokens it lacks."""
        if (
            session.session_id is None
            or session.replica != self.target
            or common_prefix(session.history, prompt) < len(session.history)
        ):
            await self._rebuild(session, prompt)  # append-only: the past cannot change
            return
        try:
            if session.verify:
                info = await self._unary("GetSessionInfo", session_id=session.session_id)
                if info.history_length != session.history_length:
                    await self._rebuild(session, session.history)
                session.verify = False
            delta = prompt[len(session.history) :]
            if delta:
                expected = session.history_length + len(delta)
                appended = await self._unary(
                    "AppendTokens", session_id=session.session_id, token_ids=delta
                )
                session.appended(delta)
                if appended.history_length != expected:
                    await self._rebuild(session, session.history)
        except SessionLost:
            await self._rebuild(session, prompt)

    def _generate_request(self, session: EngineSession, request: GenerationRequest) -> Any:
        return self._pb.GenerateRequest(
            session_id=session.session_id,
            max_tokens=request.max_tokens,
            seed=request.seed,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
        )

    async def _generate(
        self, session: EngineSession, request: GenerationRequest, prompt: list[int]
    ) -> AsyncIterator[AdapterEvent]:
        await self._prepare(session, prompt)
        tokens_in = len(prompt)
        rid = request.request_id
        decoder = PieceDecoder(self._tokenizer)
        matcher = StopMatcher(request.stop)
        sent = generated = dropped = 0
        for attempt in (1, 2):
            call = self._rpc().Generate(self._generate_request(session, request))
            self._calls.hold(rid, call)
            done: Any = None
            retry = False
            try:
                async for message in call:
                    kind = message.WhichOneof("payload")
                    if kind == "truncated":
                        dropped = message.truncated.dropped_token_count
                        session.truncated(dropped)
                    elif kind == "token_id":
                        generated += 1
                        session.appended([message.token_id])
                        token = Token(
                            text=decoder.text(message.token_id), token_id=message.token_id
                        )
                        for out in matcher.push(token):
                            sent += 1
                            yield out
                        if matcher.stopped:
                            break
                    else:
                        done = message.done
                        break
            except grpc.aio.AioRpcError as exc:
                error = self._error(exc)
                retry = isinstance(error, SessionLost) and generated == dropped == 0
                if not (retry and attempt == 1):
                    raise error from exc
            except asyncio.CancelledError:
                if self._calls.cancelled_by_request(rid):
                    return  # cancel(): like every adapter, the stream just ends
                raise
            finally:
                self._calls.release(rid)
                if done is None and not retry:  # the runtime may have committed more tokens
                    session.verify = True
                    call.cancel()
            if not retry:
                break
            await self._rebuild(session, session.history)
        for out in matcher.flush():
            sent += 1
            yield out
        if done is None:
            if not matcher.stopped:
                raise EngineFailure("kakeya runtime closed the stream without GenerateDone")
            yield SessionFinish(
                "stop", tokens_in, sent, "stop_string", dropped, session.history_length
            )
            return
        reason = self._pb.GenerateDone.StopReason.Name(done.stop_reason)
        if reason not in _REASONS:
            raise AdapterError(f"kakeya runtime ended the generation: {reason}", retriable=True)
        if done.generated_token_count != generated:
            session.verify = True
            raise SessionDrift(
                "generated tokens", expected=generated, actual=done.generated_token_count
            )
        yield SessionFinish(
            _REASONS[reason], tokens_in, sent, reason, dropped, session.history_length
        )

    async def fork(self, session: EngineSession, *, at: int) -> EngineSession:
        """A new session holding the first ``at`` tokens of ``session``'s record."""
        if not 0 <= at <= len(session.history):
            raise EngineFailure(
                f"cannot fork at {at}: the session holds {len(session.history)} tokens"
            )
        child = self.open_session()
        await self._rebuild(child, session.history[:at])
        return child

    async def health(self) -> Health:
        try:  # a real round trip; a probe id the runtime cannot know answers NOT_FOUND
            await self._unary("GetSessionInfo", session_id=_PROBE_SESSION)
        except SessionLost:
            return Health(live=True, ready=True)
        except EngineUnavailable as exc:
            return Health(live=False, ready=False, detail=exc.message)
        except AdapterError as exc:
            return Health(live=True, ready=False, detail=exc.message)
        return Health(live=True, ready=True)

    async def capabilities(self) -> Capabilities:
        return Capabilities(
            engine="kakeya",
            engine_version="kakeya.v1",
            model=self._model,
            model_hash=self._model_hash,
            context_size=self._context_size,
            features=("seed", "stop", "token_ids", "sessions", "fork"),
            extra={"target": self.target, "vocab_size": self._tokenizer.vocab_size},
        )


class KakeyaOptions(SessionOptions):
    context_size: int = Field(default=4096, description="the runtime's context size in tokens")


def _build(
    replica: ReplicaConfig, options: KakeyaOptions, defaults: EngineDefaults
) -> KakeyaAdapter:
    return KakeyaAdapter(**options.session_args(replica), context_size=options.context_size)


VARIANT = session_variant(KakeyaAdapter, KakeyaOptions, _build, example_port=50051)
