"""Stop strings over a token stream, with the OpenAI semantics: the stop string and what
follows it are never emitted. Tokens that might begin a stop string are held back until the
text after them rules it out.
"""

from __future__ import annotations

from worker_adapters.base import Token


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._emitted = ""  # text already released; no stop can begin inside it
        self._held: list[Token] = []
        self.stopped = False

    def push(self, token: Token) -> list[Token]:
        """Feed one token; returns the tokens now safe to emit (``stopped`` tells if a stop hit)."""
        if not self.stops:
            return [token]
        self._held.append(token)
        pending = "".join(t.text for t in self._held)
        text = self._emitted + pending
        hit = _first_stop(text, self.stops, len(self._emitted))
        if hit is not None:
            self.stopped = True
            out = _cut(self._held, hit - len(self._emitted))
            self._held = []
            return out
        safe = _safe_length(text, self.stops) - len(self._emitted)
        out = []
        while self._held and len(self._held[0].text) <= safe:
            tok = self._held.pop(0)
            safe -= len(tok.text)
            self._emitted += tok.text
            out.append(tok)
        return out

    def flush(self) -> list[Token]:
        """At the end of generation: what was held back is emitted after all."""
        out, self._held = self._held, []
        return out


def _cut(held: list[Token], upto: int) -> list[Token]:
    """The held tokens truncated to their first ``upto`` characters (empty pieces dropped)."""
    out = []
    for tok in held:
        if upto <= 0:
            break
        out.append(Token(text=tok.text[:upto], token_id=tok.token_id, logprob=tok.logprob))
        upto -= len(tok.text)
    return out


def _safe_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the prefix of ``text`` in which no stop string can still begin."""
    safe = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                safe = min(safe, len(text) - k)
                break
    return safe


def _first_stop(text: str, stops: tuple[str, ...], searched_upto: int) -> int | None:
    """Index where the earliest stop string begins, at or after ``searched_upto``."""
    best: int | None = None
    for stop in stops:
        idx = text.find(stop, searched_upto)
        if idx != -1 and (best is None or idx < best):
            best = idx
    return best
