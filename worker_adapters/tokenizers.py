"""Control-plane tokenizers, for the engines that take raw token ids (Kakeya, Salience).

A pool names one with ``options.tokenizer`` (see :func:`tokenizer_named`): ``sim`` for the
sim engine's vocabulary, ``packaged`` (or ``gguf``) for the packaged Gemma 3 270M GGUF's, or
the path of a GGUF file. A GGUF file's vocabulary is read without its weights.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Protocol

from worker_adapters.llama import default_model_path, file_sha256
from worker_adapters.sim import VOCAB

# the names of the packaged model's vocabulary; any other name but ``sim`` is a GGUF path
PACKAGED = ("packaged", "gguf")


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
        import llama_cpp  # the engine library, only where a GGUF vocabulary is asked for

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


def tokenizer_named(name: str) -> Tokenizer:
    """``sim``, ``packaged`` / ``gguf`` (the packaged GGUF's vocabulary), or a GGUF path."""
    if name == "sim":
        return SimTokenizer()
    return _gguf(None if name in PACKAGED else name)


@functools.cache
def _gguf(path: str | None) -> LlamaTokenizer:
    """One reading of each GGUF vocabulary (seconds for a large one), shared by the replicas
    that name it: a tokenizer holds no state between calls."""
    return LlamaTokenizer(path)


class PieceDecoder:
    """Token ids to text, holding back the bytes of a character split across tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer.piece(token_id))
