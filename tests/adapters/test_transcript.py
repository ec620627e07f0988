"""Chat messages rendered as a transcript for a model with no chat template."""

from __future__ import annotations

import pytest

from worker_adapters.llama import _stop_reason
from worker_adapters.transcript import TURN_STOPS, render_transcript

CHAT = (
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
)


def test_each_turn_is_a_labelled_line_and_the_reply_is_left_open() -> None:
    assert render_transcript(CHAT).prompt == (
        "System: You answer briefly.\n"
        "User: What is the capital of France?\n"
        "Assistant: Paris.\n"
        "User: And of Italy?\n"
        "Assistant:"
    )


def test_every_turn_label_on_a_new_line_ends_the_reply() -> None:
    assert render_transcript(CHAT).stops == TURN_STOPS
    assert set(TURN_STOPS) == {"\nSystem:", "\nUser:", "\nAssistant:", "\nTool:"}


def test_equal_messages_render_equal_prompts() -> None:
    reordered = tuple({"content": m["content"], "role": m["role"]} for m in CHAT)
    assert render_transcript(reordered) == render_transcript(CHAT)
    assert render_transcript(list(CHAT)) == render_transcript(CHAT)


def test_content_is_kept_as_given() -> None:
    text = "  two\nlines, <start_of_turn> and a trailing space "
    prompt = render_transcript(({"role": "user", "content": text},)).prompt
    assert prompt == f"User: {text}\nAssistant:"


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ({"role": "tool", "content": '{"sum": 5}'}, 'Tool: {"sum": 5}'),
        ({"role": "user", "content": ""}, "User:"),
        ({"role": "critic", "content": "no"}, "Critic: no"),
    ],
)
def test_labels_and_empty_turns(message: dict[str, str], line: str) -> None:
    assert render_transcript((message,)).prompt == f"{line}\nAssistant:"


def test_no_messages_is_an_open_reply() -> None:
    assert render_transcript(()).prompt == "Assistant:"


@pytest.mark.parametrize(
    ("rest", "request_stops", "reason"),
    [
        ("\nUser: and then?", (), "eos"),
        ("\nUser: and then?", ("###",), "eos"),
        ("\nUser: and then?", ("\n",), "stop"),  # the request's own stop cut here too
        ("###\nUser:", ("###",), "stop"),
    ],
)
def test_a_turn_label_ends_the_reply_as_eos(
    rest: str, request_stops: tuple[str, ...], reason: str
) -> None:
    assert _stop_reason(rest, request_stops) == reason
