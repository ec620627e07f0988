"""The sim engine's JSON for a schema: deterministic per seed, parseable, imperfect on purpose."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from orchestrator_core.plans import plan_schema
from worker_adapters import Finish, GenerationRequest, Token
from worker_adapters.sim import SimAdapter

TOOLS = [
    {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "echo",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
]
SCHEMA = plan_schema(TOOLS)


def request(seed: int, **kw: Any) -> GenerationRequest:
    base: dict[str, Any] = {
        "request_id": f"r{seed}",
        "prompt": "plan",
        "messages": None,
        "seed": seed,
        "max_tokens": 500,
        "json_schema": SCHEMA,
    }
    base.update(kw)
    return GenerationRequest(**base)


async def text_of(req: GenerationRequest) -> tuple[str, Finish]:
    adapter = SimAdapter(tokens_per_s=0)
    events = [e async for e in adapter.stream(req)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    return "".join(e.text for e in events if isinstance(e, Token)), finish


async def test_same_request_same_json_and_seeds_differ() -> None:
    a, fa = await text_of(request(1))
    b, _ = await text_of(request(1))
    others = {(await text_of(request(s)))[0] for s in range(2, 8)}
    assert a == b
    assert fa.stop_reason == "eos"
    assert len(others - {a}) >= 5


async def test_outputs_parse_and_are_sometimes_invalid() -> None:
    validator = Draft202012Validator(SCHEMA)
    valid = invalid = unknown = 0
    for seed in range(60):
        text, _ = await text_of(request(seed))
        plan = json.loads(text)
        if validator.is_valid(plan):
            valid += 1
        else:
            invalid += 1
        unknown += sum(
            1
            for c in plan.get("calls", [])
            if isinstance(c, dict) and c.get("tool") == "unknown_tool"
        )
    assert valid > 0 and invalid > 0 and unknown > 0


async def test_max_tokens_cuts_the_json() -> None:
    _text, finish = await text_of(request(3, max_tokens=3))
    assert finish.stop_reason == "length" and finish.tokens_out == 3


async def test_requests_without_a_schema_are_unchanged() -> None:
    # recorded before the sim engine learned JSON schemas: plain sampling must not move
    adapter = SimAdapter(tokens_per_s=0, eos_probability=0.0)
    events = [
        e
        async for e in adapter.stream(
            GenerationRequest(request_id="x", prompt="hello", messages=None, seed=7, max_tokens=6)
        )
    ]
    tokens = [(e.text, e.token_id) for e in events if isinstance(e, Token)]
    assert tokens == EXPECTED_PLAIN


EXPECTED_PLAIN: list[tuple[str, int | None]] = [
    ("to ", 3),
    ("seed ", 50),
    ("? ", 73),
    ("are ", 16),
    ("up ", 39),
    ("step ", 43),
]
