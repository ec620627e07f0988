"""The control plane's handle on one engine-side session (Kakeya, Salience).

An :class:`EngineSession` records the engine's id for the session, every token id the engine
was given or generated (the protocols take raw token ids, so the control plane tokenizes), and
the length the engine is believed to hold. The text the session holds is read off that record
(:meth:`EngineSession.spelled`: its tokens' pieces), so it can never disagree with the ids.
It imports nothing of the adapters: ``GenerationRequest.session`` carries it, and
``worker_adapters.sessions`` checks it against what the engine reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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
    # the pieces of history[:_spelled_n], joined: a turn reads the pieces of its new tokens only
    _spelled: bytearray = field(default_factory=bytearray, init=False, repr=False)
    _spelled_n: int = field(default=0, init=False, repr=False)

    def spelled(self, piece: Callable[[int], bytes]) -> bytes:
        """The text the record's tokens spell, as UTF-8 bytes: their pieces joined (``piece``,
        the vocabulary's). That is the prompt text sent, for a vocabulary whose tokens spell
        the text they were made from, and the generated text as the engine streamed it."""
        if self._spelled_n > len(self.history):  # the record was cut behind the cache's back
            self._forget_spelling()
        for token_id in self.history[self._spelled_n :]:
            self._spelled += piece(token_id)
        self._spelled_n = len(self.history)
        return bytes(self._spelled)

    def _forget_spelling(self) -> None:
        self._spelled.clear()
        self._spelled_n = 0

    def appended(self, token_ids: list[int]) -> None:
        self.history.extend(token_ids)
        self.history_length += len(token_ids)

    def truncated(self, count: int) -> None:
        self.history_length -= count
        self.dropped += count

    def rewound(self, length: int) -> None:
        """The engine cut the session back to ``length`` tokens (protocols that rewind)."""
        if length < self._spelled_n:
            self._forget_spelling()
        del self.history[length:]
        self.history_length = length
        self.dropped = 0

    def rebuilt(self, session_id: str, replica: str, token_ids: list[int]) -> None:
        """A fresh engine session now holds exactly ``token_ids``."""
        self.session_id = session_id
        self.replica = replica
        self.read_back(token_ids)
        self.dropped = 0

    def read_back(self, token_ids: list[int]) -> None:
        """The engine holds exactly ``token_ids``: what it answered when asked (it may hold
        tokens the record lacks), or what a fresh session was given."""
        kept = self._spelled_n
        if token_ids[:kept] != self.history[:kept]:
            self._forget_spelling()
        self.history = list(token_ids)
        self.history_length = len(token_ids)
        self.verify = False
