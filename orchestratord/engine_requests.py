"""From a normalized llm input to an engine request."""

from __future__ import annotations

from orchestrator_core.generation import LlmInput
from worker_adapters import GenerationRequest


def generation_request(
    llm: LlmInput, *, request_id: str, seed: int, max_tokens: int | None = None
) -> GenerationRequest:
    p = llm.params
    return GenerationRequest(
        request_id=request_id,
        prompt=llm.prompt,
        messages=None
        if llm.messages is None
        else tuple({"role": m.role, "content": m.content} for m in llm.messages),
        seed=seed,
        max_tokens=p.max_tokens if max_tokens is None else max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        stop=p.stop,
        model=llm.model,
        logprobs=p.logprobs,
        json_schema=p.json_schema,
    )
