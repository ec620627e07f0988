"""Normalization of LLM inputs, so equal requests hash equal.

Prompt rules: text is Unicode NFC and line endings are ``\\n``; whitespace is otherwise kept
as given, because engines see it. Messages keep their order; each is ``{role, content}``.
Params: every sampling parameter is filled with its default, so an omitted ``top_p`` and an
explicit ``top_p: 1.0`` give one params hash.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from orchestrator_core.canonical import sha256_of

DEFAULT_PARAMS: dict[str, Any] = {
    "max_tokens": 128,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "stop": [],
    "logprobs": False,
    "json_schema": None,
}


def normalize_text(text: str) -> str:
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = DEFAULT_PARAMS["max_tokens"]
    temperature: float = DEFAULT_PARAMS["temperature"]
    top_p: float = DEFAULT_PARAMS["top_p"]
    top_k: int = DEFAULT_PARAMS["top_k"]
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    json_schema: dict[str, Any] | None = None

    @property
    def samples(self) -> bool:
        """Whether the output depends on a seed: temperature 0 is greedy, the same tokens on
        any engine; any other temperature (an omitted one is the default, 1.0) samples."""
        return self.temperature != 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": self.top_k,
            "stop": list(self.stop),
            "logprobs": self.logprobs,
            "json_schema": self.json_schema,
        }


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class LlmInput:
    """A normalized llm_call input: exactly one of ``prompt`` and ``messages`` is set."""

    prompt: str | None
    messages: tuple[Message, ...] | None
    params: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None

    def prompt_material(self) -> dict[str, Any]:
        if self.messages is not None:
            return {"messages": [{"role": m.role, "content": m.content} for m in self.messages]}
        return {"prompt": self.prompt}

    @property
    def prompt_hash(self) -> str:
        return sha256_of(self.prompt_material())

    @property
    def params_hash(self) -> str:
        return sha256_of(self.params.as_dict())


def llm_input_of(step_input: dict[str, Any]) -> LlmInput:
    """Normalize a stored ``llm_call`` input (``prompt`` or ``messages``, ``params``, ``model``)."""
    return normalize_llm_input(
        prompt=step_input.get("prompt"),
        messages=step_input.get("messages"),
        params=step_input.get("params"),
        model=step_input.get("model"),
    )


def normalize_llm_input(
    *,
    prompt: str | None,
    messages: list[dict[str, str]] | None,
    params: dict[str, Any] | None,
    model: str | None,
) -> LlmInput:
    given = {k: v for k, v in (params or {}).items() if v is not None}
    merged = {**DEFAULT_PARAMS, **given}
    sampling = SamplingParams(
        max_tokens=int(merged["max_tokens"]),
        temperature=float(merged["temperature"]),
        top_p=float(merged["top_p"]),
        top_k=int(merged["top_k"]),
        stop=tuple(normalize_text(s) for s in merged["stop"]),
        logprobs=bool(merged["logprobs"]),
        json_schema=merged["json_schema"],
    )
    if messages is not None:
        msgs = tuple(
            Message(role=m["role"], content=normalize_text(m["content"])) for m in messages
        )
        return LlmInput(prompt=None, messages=msgs, params=sampling, model=model)
    return LlmInput(
        prompt=normalize_text(prompt or ""), messages=None, params=sampling, model=model
    )
