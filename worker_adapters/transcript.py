"""Chat messages as a plain-text transcript, for a model whose file has no chat template.

A base model (the default Gemma 3 270M is one) was trained to continue text, not to take
turns: its GGUF carries no chat template, and an instruction-tuned format it never saw gives
noise. What it does continue sensibly is a transcript::

    System: You answer briefly.
    User: What is the capital of France?
    Assistant: Paris.
    User: And of Italy?
    Assistant:

It writes the assistant's reply and then goes on to invent the next ``User:`` turn, so the
transcript comes with stop strings at every turn label: the reply ends where the model
starts a turn of its own. The rendering is a pure function of the messages (no dates, no
randomness), so equal messages give an equal prompt and equal tokens for a seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROLE_LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TURN_STOPS = tuple(f"\n{label}:" for label in ROLE_LABELS.values())


@dataclass(frozen=True, slots=True)
class Transcript:
    prompt: str
    stops: tuple[str, ...]  # where the model begins a turn that is not its own


def role_label(role: str) -> str:
    """The label of a turn: the known roles by name, any other capitalized."""
    return ROLE_LABELS.get(role) or role[:1].upper() + role[1:]


def render_transcript(messages: Sequence[Mapping[str, str]]) -> Transcript:
    """``Label: content`` per message, one a line, then ``Assistant:`` for the reply.

    Content is kept as given (it was normalized, and hashed, before it reached the engine);
    an empty message is its label alone, so no line ends in a space.
    """
    lines = []
    for message in messages:
        label, content = role_label(message["role"]), message["content"]
        lines.append(f"{label}: {content}" if content else f"{label}:")
    lines.append(f"{ROLE_LABELS['assistant']}:")
    return Transcript(prompt="\n".join(lines), stops=TURN_STOPS)
