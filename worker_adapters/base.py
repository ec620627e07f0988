"""The adapter interface: ``stream``, ``cancel``, ``health``, ``capabilities``.

An adapter turns one engine protocol into a stream of :class:`Token` followed by exactly one
:class:`Finish`. It raises only :mod:`worker_adapters.errors`. ``cancel`` may be called from
another task while ``stream`` is being iterated; closing the iterator (``aclose``) must also
release the engine's slot.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from worker_adapters.session_handle import EngineSession


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    seed: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    model: str | None = None
    logprobs: bool = False
    json_schema: dict[str, Any] | None = None
    session: EngineSession | None = None  # the run's engine session, for session-bound engines

    def rendered_prompt(self) -> str:
        """Plain text for engines that take a prompt string and have no chat template."""
        if self.messages is None:
            return self.prompt or ""
        return "".join(f"{m['role']}: {m['content']}\n" for m in self.messages) + "assistant:"


@dataclass(frozen=True, slots=True)
class TokenAlternative:
    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token; ``logprob`` is its own.

    ``alternatives``, the engine's most likely tokens at its position (best first), are read
    from every token and are empty but on a :class:`RankedToken`: a plain token, made for
    each token of every stream, costs no more to make for the few engines that rank.
    """

    text: str
    token_id: int | None = None
    logprob: float | None = None

    @property
    def alternatives(self) -> tuple[TokenAlternative, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class RankedToken(Token):
    """A token with its alternatives (Salience with ``top_logprobs``). A token cut short by a
    stop string is re-emitted as a plain :class:`Token`."""

    alternatives: tuple[TokenAlternative, ...] = ()


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of a stream. ``engine_reason`` (the engine's own stop reason, as its protocol
    names it) and ``truncated`` (tokens the engine dropped from the run's session to fit its
    window) are read from every Finish and told by the engines that have them (a
    :class:`~worker_adapters.sessions.SessionFinish`)."""

    stop_reason: str  # eos | length | stop
    tokens_in: int
    tokens_out: int

    @property
    def engine_reason(self) -> str:
        return ""

    @property
    def truncated(self) -> int:
        return 0


AdapterEvent = Token | Finish


@dataclass(frozen=True)
class Capabilities:
    """What an engine tells of itself. ``model`` is the model a replica's requests name (its
    configured one, else the engine's); ``models`` every model the engine says it serves
    (default: ``model`` alone, none when ``model`` is empty); ``context_size`` its window in
    tokens, 0 when unknown; ``extra`` engine-specific facts, shown beside the others."""

    engine: str
    engine_version: str
    model: str
    model_hash: str
    context_size: int
    quantization: str | None = None
    features: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.models and self.model:
            object.__setattr__(self, "models", (self.model,))

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model": self.model,
            "models": list(self.models),
            "model_hash": self.model_hash,
            "context_size": self.context_size,
            "quantization": self.quantization,
            "features": list(self.features),
            **self.extra,
        }


@dataclass(frozen=True)
class Health:
    live: bool
    ready: bool
    detail: str = ""


class WorkerAdapter(abc.ABC):
    kind: ClassVar[str]
    # The engine keeps a conversation in a session (``worker_adapters.sessions``): a run's
    # requests carry the run's session and stay on the replica that holds it.
    session_bound: ClassVar[bool] = False

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load models or open connections; called once before the replica takes work."""

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        """Generate for ``request``: tokens, then one Finish."""

    @abc.abstractmethod
    async def cancel(self, request_id: str) -> None:
        """Abort the request; the engine frees its slot. Unknown ids are ignored."""

    @abc.abstractmethod
    async def health(self) -> Health: ...

    @abc.abstractmethod
    async def capabilities(self) -> Capabilities: ...

    def count_tokens(self, request: GenerationRequest) -> int | None:
        """Prompt tokens of ``request`` by the engine's own tokenizer, or None if it has none."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most adapters hold nothing
        """Release connections and threads held by the adapter."""
