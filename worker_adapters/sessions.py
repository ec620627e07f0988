"""Engine-side sessions owned by a run, for the session-bound protocols (Kakeya, Salience).

An :class:`EngineSession` is the control plane's record of one session on one engine replica:
the engine's id for it, every token id the engine was given or generated (the protocols take
raw token ids, so the control plane tokenizes), and the length the engine is believed to hold.
Adapters check that length against what the engine reports on every call, repair a mismatch by
recreating the session from the record, and raise :class:`SessionDrift` when they cannot:
the two sides never diverge unnoticed.

Errors (all :class:`~worker_adapters.errors.AdapterError`, retriable):

SessionLost    the engine no longer knows the session and it could not be recreated here
SessionDrift   the engine holds another history than the record, and repairing failed

What the generic events cannot carry travels on subclasses, so consumers that only know
:class:`Token` and :class:`Finish` keep working: :class:`SessionFinish` (the engine's own stop
reason, tokens dropped by truncation) and :class:`RankedToken` (top-k alternatives).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from worker_adapters.base import Finish, Token
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.sim import VOCAB


@dataclass(eq=False)
class EngineSession:
    """One engine session; identity equality, one per run and protocol."""

    protocol: str  # the adapter kind that owns it: "kakeya" | "salience"
    replica: str  # address of the engine that holds it
    session_id: str | None = None  # issued by the engine on first use
    history: list[int] = field(default_factory=list)  # token ids given to or made by the engine
    history_length: int = 0  # tokens the engine holds: history less what truncation dropped
    dropped: int = 0  # tokens the engine dropped to fit its window
    verify: bool = False  # a stream ended early: the engine may hold tokens not recorded here
    rebuilds: int = 0  # times the session was recreated from the record
    # a run forked from another: its first use forks this session on the engine at the
    # longest prefix the two share (engines that fork sessions), instead of starting anew
    fork_of: EngineSession | None = None
    forked_at: int | None = None  # where it was forked, once it was

    def appended(self, token_ids: list[int]) -> None:
        self.history.extend(token_ids)
        self.history_length += len(token_ids)

    def truncated(self, count: int) -> None:
        self.history_length -= count
        self.dropped += count

    def rewound(self, length: int) -> None:
        """The engine cut the session back to ``length`` tokens (protocols that rewind)."""
        del self.history[length:]
        self.history_length = length
        self.dropped = 0

    def rebuilt(self, session_id: str, replica: str, token_ids: list[int]) -> None:
        """A fresh engine session now holds exactly ``token_ids``."""
        self.session_id = session_id
        self.replica = replica
        self.history = list(token_ids)
        self.history_length = len(token_ids)
        self.dropped = 0
        self.verify = False


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


@dataclass(frozen=True, slots=True)
class TokenAlternative:
    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True, slots=True)
class RankedToken(Token):
    """A token with the engine's most likely alternatives at its position, best first.

    ``logprob`` is the chosen token's. A token cut short by a stop string is re-emitted as a
    plain :class:`Token`.
    """

    alternatives: tuple[TokenAlternative, ...] = ()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Tokenizer(Protocol):
    """Control-plane tokenization for engines that take raw token ids."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str  # identifies the vocabulary (and with it the model family)

    def encode(self, text: str) -> list[int]: ...

    def piece(self, token_id: int) -> bytes: ...


_PIECE = re.compile(r"\S+\s*|\s+")


class SimTokenizer:
    """The sim engine's vocabulary, then one id per byte for any other piece of text.

    Pieces are split as the sim counts tokens; sim words map to their ``VOCAB`` index, so the
    text of generated tokens tokenizes back to the same ids.
    """

    def __init__(self) -> None:
        self._index = {word: i for i, word in enumerate(VOCAB)}
        self.vocab_size = len(VOCAB) + 256
        self.eos_token_ids: tuple[int, ...] = ()
        vocab = json.dumps(VOCAB).encode()
        self.fingerprint = "sha256:" + hashlib.sha256(vocab).hexdigest()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            word = self._index.get(piece)
            if word is None:
                ids.extend(len(VOCAB) + b for b in piece.encode())
            else:
                ids.append(word)
        return ids

    def piece(self, token_id: int) -> bytes:
        if token_id < len(VOCAB):
            return VOCAB[token_id].encode()
        return bytes([token_id - len(VOCAB)])


class LlamaTokenizer:
    """A GGUF model's own tokenizer (vocabulary only; the weights are not loaded)."""

    def __init__(self, model_path: str | Path | None = None) -> None:
        import llama_cpp

        from worker_adapters.llama import default_model_path, file_sha256

        path = Path(model_path) if model_path else default_model_path()
        self._llm: Any = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        vocab = self._llm._model.vocab
        self.vocab_size = int(self._llm.n_vocab())
        self.eos_token_ids = tuple(
            i for i in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)
        )
        self.fingerprint = file_sha256(path)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._llm.tokenize(text.encode(), add_bos=True, special=False)]

    def piece(self, token_id: int) -> bytes:
        return bytes(self._llm.detokenize([token_id], special=False))


class PieceDecoder:
    """Token ids to text, holding back the bytes of a character split across tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer.piece(token_id))
