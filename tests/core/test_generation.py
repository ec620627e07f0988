"""Normalization of LLM inputs (orchestrator_core.generation)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.canonical import sha256_of
from orchestrator_core.generation import (
    DEFAULT_PARAMS,
    LlmInput,
    Message,
    SamplingParams,
    normalize_llm_input,
    normalize_text,
)


def llm(
    prompt: str | None = "hello",
    messages: list[dict[str, str]] | None = None,
    params: dict[str, Any] | None = None,
    model: str | None = None,
) -> LlmInput:
    return normalize_llm_input(prompt=prompt, messages=messages, params=params, model=model)


# --- params ------------------------------------------------------------------------------------


def test_default_params_values() -> None:
    assert DEFAULT_PARAMS == {
        "max_tokens": 128,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "stop": [],
        "logprobs": False,
        "json_schema": None,
    }
    assert SamplingParams().as_dict() == DEFAULT_PARAMS


@pytest.mark.parametrize(
    "explicit",
    [
        {"top_p": 1.0},
        {"temperature": 1.0},
        {"temperature": 1},
        {"top_p": 1},
        {"max_tokens": 128},
        {"top_k": 0},
        {"stop": []},
        {"top_p": None, "temperature": None},
        dict(DEFAULT_PARAMS),
        {"max_tokens": 128.0, "temperature": 1, "top_p": 1, "top_k": 0.0, "stop": ()},
    ],
    ids=repr,
)
def test_omitted_params_hash_equal_to_explicit_defaults(explicit: dict[str, Any]) -> None:
    omitted = llm(params=None)
    assert llm(params={}).params_hash == omitted.params_hash
    given = llm(params=explicit)
    assert given.params == omitted.params
    assert given.params_hash == omitted.params_hash


@pytest.mark.parametrize(
    "changed",
    [
        {"top_p": 0.9},
        {"temperature": 0.0},
        {"temperature": 0.7},
        {"max_tokens": 16},
        {"top_k": 40},
        {"stop": ["\n"]},
    ],
    ids=repr,
)
def test_non_default_params_hash_differently(changed: dict[str, Any]) -> None:
    assert llm(params=changed).params_hash != llm(params=None).params_hash


def test_params_are_typed() -> None:
    params = llm(params={"max_tokens": "16", "temperature": 0, "top_p": "0.5"}).params
    assert params.max_tokens == 16
    assert isinstance(params.temperature, float)
    assert params.temperature == 0.0
    assert params.top_p == 0.5
    assert params.stop == ()


def test_params_hash_is_hash_of_as_dict() -> None:
    item = llm(params={"max_tokens": 7, "stop": ["x"]})
    assert item.params_hash == sha256_of(
        {
            "max_tokens": 7,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "stop": ["x"],
            "logprobs": False,
            "json_schema": None,
        }
    )
    assert item.params.as_dict()["stop"] == ["x"]


def test_params_hash_ignores_prompt_and_model() -> None:
    a = llm(prompt="one", model="m1", params={"top_k": 5})
    b = llm(prompt="two", model="m2", params={"top_k": 5})
    assert a.params_hash == b.params_hash
    assert a.prompt_hash != b.prompt_hash


def test_stop_strings_normalized() -> None:
    item = llm(params={"stop": ["a\r\nb", "e\u0301", "\r"]})
    assert item.params.stop == ("a\nb", "\u00e9", "\n")
    assert item.params_hash == llm(params={"stop": ["a\nb", "\u00e9", "\n"]}).params_hash


def test_default_params_dict_not_mutated() -> None:
    llm(params={"stop": ["x"], "top_k": 3})
    assert DEFAULT_PARAMS["stop"] == []
    assert DEFAULT_PARAMS["top_k"] == 0


# --- text --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a\r\nb", "a\nb"),
        ("a\rb", "a\nb"),
        ("a\r\n\r\nb\r", "a\n\nb\n"),
        ("a\n\rb", "a\n\nb"),
        ("cafe\u0301", "caf\u00e9"),
        ("  keep   spaces\t\n", "  keep   spaces\t\n"),
        ("", ""),
    ],
)
def test_normalize_text(raw: str, expected: str) -> None:
    assert normalize_text(raw) == expected


def test_crlf_prompt_hash_equal() -> None:
    a = llm(prompt="line one\r\nline two\r\n")
    b = llm(prompt="line one\nline two\n")
    assert a.prompt == b.prompt == "line one\nline two\n"
    assert a.prompt_hash == b.prompt_hash


def test_nfc_prompt_hash_equal() -> None:
    assert llm(prompt="cafe\u0301").prompt_hash == llm(prompt="caf\u00e9").prompt_hash


def test_whitespace_is_material() -> None:
    assert llm(prompt="hi").prompt_hash != llm(prompt="hi ").prompt_hash
    assert llm(prompt="a b").prompt_hash != llm(prompt="a  b").prompt_hash


def test_crlf_messages_hash_equal() -> None:
    a = llm(prompt=None, messages=[{"role": "user", "content": "x\r\ny"}])
    b = llm(prompt=None, messages=[{"role": "user", "content": "x\ny"}])
    assert a.messages == (Message(role="user", content="x\ny"),)
    assert a.prompt_hash == b.prompt_hash


# --- prompt vs messages ------------------------------------------------------------------------


def test_prompt_and_messages_hash_differently() -> None:
    by_prompt = llm(prompt="hello")
    by_messages = llm(prompt=None, messages=[{"role": "user", "content": "hello"}])
    assert by_prompt.prompt_hash != by_messages.prompt_hash
    rendered = llm(prompt=_render(by_messages))
    assert rendered.prompt_hash != by_messages.prompt_hash


def test_prompt_material() -> None:
    assert llm(prompt="p").prompt_material() == {"prompt": "p"}
    item = llm(prompt=None, messages=[{"role": "system", "content": "s"}])
    assert item.prompt_material() == {"messages": [{"role": "system", "content": "s"}]}
    assert item.prompt_hash == sha256_of({"messages": [{"role": "system", "content": "s"}]})
    assert llm(prompt="p").prompt_hash == sha256_of({"prompt": "p"})


def test_message_order_is_material() -> None:
    one = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert llm(prompt=None, messages=one).prompt_hash != (
        llm(prompt=None, messages=list(reversed(one))).prompt_hash
    )


def test_message_extra_keys_ignored_and_key_order_irrelevant() -> None:
    a = llm(prompt=None, messages=[{"role": "user", "content": "a", "name": "bob"}])
    b = llm(prompt=None, messages=[{"content": "a", "role": "user"}])
    assert a.prompt_hash == b.prompt_hash


def test_messages_win_over_prompt() -> None:
    item = llm(prompt="ignored", messages=[{"role": "user", "content": "m"}])
    assert item.prompt is None
    assert item.messages == (Message("user", "m"),)


def test_missing_prompt_is_empty_prompt() -> None:
    assert llm(prompt=None).prompt == ""
    assert llm(prompt=None).prompt_hash == llm(prompt="").prompt_hash


def test_empty_messages_differ_from_empty_prompt() -> None:
    empty = llm(prompt=None, messages=[])
    assert empty.messages == ()
    assert empty.prompt_hash == sha256_of({"messages": []})
    assert empty.prompt_hash != llm(prompt="").prompt_hash


def test_model_is_kept_but_not_hashed() -> None:
    a = llm(model="gemma")
    assert a.model == "gemma"
    assert a.prompt_hash == llm(model=None).prompt_hash


# --- render: one rendering, the engine request's ------------------------------------------------


def _render(item: LlmInput) -> str:
    from orchestratord.engine_requests import generation_request

    return generation_request(item, request_id="r", seed=1).rendered_prompt()


def test_render_prompt() -> None:
    assert _render(llm(prompt="say hi\r\n")) == "say hi\n"
    assert _render(LlmInput(prompt=None, messages=None)) == ""


def test_render_messages() -> None:
    item = llm(
        prompt=None,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi\r\nthere"},
        ],
    )
    assert _render(item) == "system: be brief\nuser: hi\nthere\nassistant:"


def test_render_no_messages() -> None:
    assert _render(llm(prompt=None, messages=[])) == "assistant:"


def test_llm_input_default_params() -> None:
    item = LlmInput(prompt="x", messages=None)
    assert item.params == SamplingParams()
    assert item.params_hash == llm(prompt="x").params_hash
