"""Engine-side sessions owned by a run, for the session-bound protocols (Kakeya, Salience).

A run's :class:`~worker_adapters.session_handle.EngineSession` records the engine's session,
every token id the engine was given or generated, and the length the engine is believed to
hold. Adapters check that length against what the engine reports on every call, repair a
mismatch by recreating the session from the record, and raise :class:`SessionDrift` when they
cannot: the two sides never diverge unnoticed. The prompt is tokenized on the control-plane
side (``worker_adapters.tokenizers``).

Errors (all :class:`~worker_adapters.errors.AdapterError`, retriable):

SessionLost    the engine no longer knows the session and it could not be recreated here
SessionDrift   the engine holds another history than the record, and repairing failed

A generation ends with a :class:`SessionFinish`: a :class:`~worker_adapters.base.Finish` that
tells the engine's own stop reason, the tokens its truncation dropped, and how long the
session is afterwards.

What the engine is to hold for a prompt is :func:`tokens_for_prompt`, a function of the
session's record and the prompt alone (see docs/engines-sessions.md, "Prompts that extend the
session").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker_adapters.base import Finish
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable

if TYPE_CHECKING:
    from worker_adapters.session_handle import EngineSession
    from worker_adapters.tokenizers import Tokenizer


class SessionLost(AdapterError):
    """The engine answered NOT_FOUND for the session; its record allows recreating it."""

    retriable = True


class SessionDrift(AdapterError):
    """The engine's history differs from the record and could not be repaired."""

    retriable = True

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(f"{message} (expected {expected} tokens, engine holds {actual})")
        self.expected = expected
        self.actual = actual


# gRPC status names -> the project's errors; see docs/engines-sessions.md.
_RETRIABLE = frozenset(
    {"FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED"}
)


def error_for_status(code: str, detail: str, *, engine: str) -> AdapterError:
    """The project's error for an engine's gRPC status (by name: no gRPC types here)."""
    message = f"{engine} answered {code}: {detail}"
    if code == "NOT_FOUND":
        return SessionLost(message)
    if code == "UNAVAILABLE":
        return EngineUnavailable(message)
    if code in _RETRIABLE:
        return AdapterError(message, retriable=True)
    return EngineFailure(message)


@dataclass(frozen=True, slots=True)
class SessionFinish(Finish):
    engine_reason: str = ""  # the engine's stop reason as named by its protocol
    truncated: int = 0  # tokens the engine dropped from the session before this generation
    session_length: int = 0  # tokens the engine holds after this generation


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tokens_for_prompt(
    session: EngineSession, text: str, tokens: list[int], tokenizer: Tokenizer
) -> list[int]:
    """The tokens ``session``'s engine is to hold before generating for a prompt whose text
    is ``text`` and whose own tokenization is ``tokens``; a function of the record and the
    prompt, so a run replayed turn by turn holds the same tokens at every turn.

    1. ``tokens``, when the record is a prefix of them: the engine lacks only the rest.
    2. When ``text`` begins with the text the record spells (:meth:`EngineSession.spelled`),
       the record followed by the rest of the text tokenized on its own
       (:func:`continuation`): a reply re-sent as text keeps the engine's own tokens, even
       where tokenizing the whole text would split it otherwise.
    3. Else ``tokens``: the prompt rewrote the past (a new session on Kakeya, a rewind on
       Salience).
    """
    history = session.history
    if tokens[: len(history)] == history:
        return tokens
    held, data = session.spelled(tokenizer.piece), text.encode()
    if not data.startswith(held):
        return tokens
    try:  # the record ends inside a character the text completes: not a token boundary
        rest = data[len(held) :].decode()
    except UnicodeDecodeError:
        return tokens
    added = continuation(tokenizer, rest)
    return tokens if added is None else history + added


def continuation(tokenizer: Tokenizer, text: str) -> list[int] | None:
    """``text`` tokenized to follow other tokens: without the tokens the vocabulary puts
    before any text (a BOS), and only if its tokens spell ``text`` exactly (a vocabulary
    that adds a space before the first word, or normalizes text, gives ``None``)."""
    ids = tokenizer.encode(text)
    lead = tokenizer.encode("")
    if ids[: len(lead)] == lead:
        ids = ids[len(lead) :]
    if b"".join(map(tokenizer.piece, ids)) != text.encode():
        return None
    return ids
