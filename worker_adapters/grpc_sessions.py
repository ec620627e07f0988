"""What the gRPC session-bound adapters (Kakeya, Salience) share: one channel per replica
made inside the running loop, unary calls with the protocol's statuses mapped, cancellable
streaming calls by request id, session handles, and the control-plane tokenizer."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import grpc  # type: ignore[import-untyped]

from worker_adapters.base import GenerationRequest, WorkerAdapter
from worker_adapters.errors import AdapterError
from worker_adapters.sessions import EngineSession, Tokenizer, error_for_status


class GrpcSessionAdapter(WorkerAdapter):
    session_bound = True
    engine_label: ClassVar[str]  # how errors name the engine

    def __init__(
        self,
        *,
        target: str,
        tokenizer: Tokenizer,
        model: str,
        pb: Any,
        model_hash: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.target = target
        self._tokenizer = tokenizer
        self._model = model
        self._model_hash = model_hash or tokenizer.fingerprint
        self._timeout_s = timeout_s
        self._pb = pb
        self._channel: Any = None
        self._stub: Any = None
        self._calls: dict[str, Any] = {}  # streaming calls in flight, by request id
        self._cancelled: set[str] = set()

    def _new_stub(self, channel: Any) -> Any:
        """The protocol's service stub on ``channel``."""
        raise AdapterError(f"{type(self).__name__} names no service stub")

    def _rpc(self) -> Any:
        if self._stub is None:  # created on first use, inside the running loop
            self._channel = grpc.aio.insecure_channel(self.target)
            self._stub = self._new_stub(self._channel)
        return self._stub

    def _error(self, exc: Any) -> AdapterError:
        return error_for_status(exc.code().name, exc.details() or "", engine=self.engine_label)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._rpc(), method)(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc

    def open_session(self) -> EngineSession:
        """A handle for a run; the engine's session is created when first used."""
        return EngineSession(protocol=self.kind, replica=self.target)

    async def close_session(self, session: EngineSession) -> None:
        if session.session_id is not None and session.replica == self.target:
            await self._close_quietly(session.session_id)
        session.session_id = None

    async def _close_quietly(self, session_id: str) -> None:
        with contextlib.suppress(AdapterError):
            await self._call("CloseSession", self._pb.CloseSessionRequest(session_id=session_id))

    async def cancel(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is not None:
            self._cancelled.add(request_id)
            call.cancel()

    def count_tokens(self, request: GenerationRequest) -> int | None:
        return len(self._tokenizer.encode(request.rendered_prompt()))

    async def aclose(self) -> None:
        for call in list(self._calls.values()):
            call.cancel()
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None
