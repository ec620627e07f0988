"""What the gRPC session-bound adapters (Kakeya, Salience) share: one channel per replica
made inside the running loop, unary calls with the protocol's statuses mapped, cancellable
streaming calls by request id, session handles, the control-plane tokenizer, and the options
and registration of their engines."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, TypedDict, TypeVar

import grpc  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field

from worker_adapters.base import AdapterEvent, GenerationRequest, WorkerAdapter
from worker_adapters.calls_in_flight import CallsInFlight
from worker_adapters.errors import AdapterError, EngineFailure
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig, UrlForms
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import error_for_status, tokens_for_prompt
from worker_adapters.tokenizers import Tokenizer, tokenizer_named


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
        self._calls = CallsInFlight()

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

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        """The prompt tokenized here and generated on the run's session; without one, on a
        one-shot session closed afterwards. On a session, the tokens the engine is to hold
        are read from its record and the prompt (:func:`tokens_for_prompt`)."""
        session = request.session or self.open_session()
        if session.protocol != self.kind:
            raise EngineFailure(
                f"a {session.protocol} session cannot be used with {self.engine_label}"
            )
        text = request.rendered_prompt()
        prompt = self._tokenizer.encode(text)
        if request.session is not None:
            prompt = tokens_for_prompt(session, text, prompt, self._tokenizer)
        try:
            async for event in self._generate(session, request, prompt):
                yield event
        finally:
            self._calls.forget(request.request_id)
            if request.session is None and session.session_id is not None:
                await self._close_quietly(session.session_id)

    @abc.abstractmethod
    def _generate(
        self, session: EngineSession, request: GenerationRequest, prompt: list[int]
    ) -> AsyncIterator[AdapterEvent]:
        """Generate for ``request`` on ``session``, whose engine is to hold ``prompt``."""

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
        self._calls.cancel(request_id)

    def count_tokens(self, request: GenerationRequest) -> int | None:
        return len(self._tokenizer.encode(request.rendered_prompt()))

    async def aclose(self) -> None:
        self._calls.cancel_all()
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


def grpc_target(url: str) -> str:
    """The gRPC target of a replica's url: ``grpc://host:port`` -> ``host:port``; any other
    form is a target as gRPC reads it (``host:port``, ``dns:///host:port``, ``unix:path``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "grpc":
        return url
    host, colon, port = rest.removesuffix("/").rpartition(":")
    if not colon or not host or "/" in host or not port.isdigit():
        raise ValueError(f"{url!r} is not grpc://host:port")
    return f"{host}:{port}"


class SessionArgs(TypedDict):
    """What every gRPC session adapter is built with from its replica and options."""

    target: str
    tokenizer: Tokenizer
    model: str
    model_hash: str | None
    timeout_s: float


class SessionOptions(BaseModel):
    """Options every gRPC session-bound engine takes."""

    model_config = ConfigDict(extra="forbid")
    tokenizer: str = Field(
        default="gguf",
        description="the vocabulary prompts are tokenized with here: sim (the sim engine's),"
        " packaged or gguf (the packaged Gemma 3 270M GGUF's), or a GGUF file's path",
    )
    model_hash: str | None = Field(
        default=None,
        description="the model's hash as provenance names it; default: the tokenizer's fingerprint",
    )
    timeout_s: float = Field(default=30.0, description="seconds each unary call may take")

    def session_args(self, replica: ReplicaConfig) -> SessionArgs:
        """The adapter's common arguments: the replica's gRPC target, the tokenizer, the
        model (the replica's, else the vocabulary's model), its hash and the call timeout."""
        model = replica.model or ("sim-1" if self.tokenizer == "sim" else "gemma-3-270m")
        return SessionArgs(
            target=replica.required_address,
            tokenizer=tokenizer_named(self.tokenizer),
            model=model,
            model_hash=self.model_hash,
            timeout_s=self.timeout_s,
        )


SessionOptionsT = TypeVar("SessionOptionsT", bound=SessionOptions)


def session_variant(
    adapter: type[GrpcSessionAdapter],
    options: type[SessionOptionsT],
    build: Callable[[ReplicaConfig, SessionOptionsT, EngineDefaults], WorkerAdapter],
    *,
    example_port: int,
) -> EngineVariant[SessionOptionsT]:
    """A gRPC session engine's registration: a replica's url is its gRPC address
    (``grpc://host:port`` or a target as gRPC reads it), and prompts are tokenized here with
    the vocabulary its ``options.tokenizer`` names."""
    return EngineVariant(
        adapter=adapter,
        options=options,
        build=build,
        url=UrlForms(
            needs="its gRPC address as url",
            examples=(f"grpc://127.0.0.1:{example_port}", f"127.0.0.1:{example_port}"),
            address=grpc_target,
        ),
        tokenizer="control_plane",
    )
