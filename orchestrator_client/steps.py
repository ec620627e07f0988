"""Step requests, built in one call each with a fresh ``client_token``.

Give ``client_token`` yourself when the interpreter must be able to repeat the same step
after a crash of its own (a deterministic token, e.g. ``f"{turn}-plan"``): the server then
answers the first step instead of running another.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, ParamSpec, TypeVar

from pydantic import ValidationError

from contracts.common import Budgets
from contracts.steps import (
    ChatMessage,
    CheckpointInput,
    CheckpointStep,
    FsOpInput,
    FsOpStep,
    GateEvalInput,
    GateEvalStep,
    LlmCallInput,
    LlmCallStep,
    LlmParams,
    LlmPlanInput,
    LlmPlanStep,
    ToolCallInput,
    ToolCallStep,
)
from orchestrator_client.calls import new_token
from orchestrator_client.errors import InvalidRequest

P = ParamSpec("P")
S = TypeVar("S")


def _checked(build: Callable[P, S]) -> Callable[P, S]:
    """A wrong argument raises :class:`InvalidRequest` naming the field, as for any body."""

    @functools.wraps(build)
    def checked(*args: P.args, **kwargs: P.kwargs) -> S:
        try:
            return build(*args, **kwargs)
        except ValidationError as exc:
            raise InvalidRequest.of(exc) from None

    return checked


def _messages(messages: list[dict[str, str]] | None) -> list[ChatMessage] | None:
    return None if messages is None else [ChatMessage.model_validate(m) for m in messages]


@_checked
def llm_call(
    prompt: str | None = None,
    *,
    messages: list[dict[str, str]] | None = None,
    model: str | None = None,
    client_token: str | None = None,
    budgets: Budgets | None = None,
    **params: Any,
) -> LlmCallStep:
    """``llm_call`` of a prompt or chat ``messages``; ``params``: ``max_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``stop``..."""
    return LlmCallStep(
        type="llm_call",
        client_token=client_token or new_token(),
        budgets=budgets,
        input=LlmCallInput(
            prompt=prompt,
            messages=_messages(messages),
            model=model,
            params=LlmParams.model_validate(params),
        ),
    )


@_checked
def llm_plan(
    prompt: str | None = None,
    *,
    tools: list[str],
    messages: list[dict[str, str]] | None = None,
    client_token: str | None = None,
    budgets: Budgets | None = None,
    **params: Any,
) -> LlmPlanStep:
    """``llm_plan``: the model suggests calls of the flow's ``tools``, each checked against
    the tool's JSON Schema (``tool_suggest`` events and ``output.suggestions``)."""
    return LlmPlanStep(
        type="llm_plan",
        client_token=client_token or new_token(),
        budgets=budgets,
        input=LlmPlanInput(
            prompt=prompt,
            messages=_messages(messages),
            tools=tools,
            params=LlmParams.model_validate(params),
        ),
    )


@_checked
def tool_call(tool: str, args: dict[str, Any], *, client_token: str | None = None) -> ToolCallStep:
    """Call a tool of the flow; ``args`` are checked against its JSON Schema first."""
    return ToolCallStep(
        type="tool_call",
        client_token=client_token or new_token(),
        input=ToolCallInput(tool=tool, args=args),
    )


@_checked
def gate(expr: str, *, wait_ms: int | None = None, client_token: str | None = None) -> GateEvalStep:
    """``gate_eval``: a CEL expression over the run's facts; with ``wait_ms`` it waits for
    facts that make it true."""
    return GateEvalStep(
        type="gate_eval",
        client_token=client_token or new_token(),
        input=GateEvalInput(expr=expr, wait_ms=wait_ms),
    )


@_checked
def checkpoint(state: dict[str, Any], *, client_token: str | None = None) -> CheckpointStep:
    """A ``checkpoint`` step: the state stored with the server's cursors, in the run's log."""
    return CheckpointStep(
        type="checkpoint",
        client_token=client_token or new_token(),
        input=CheckpointInput(state=state),
    )


@_checked
def fs_op(
    op: Literal["read", "write", "list", "stat", "delete"],
    path: str,
    *,
    content: str | None = None,
    client_token: str | None = None,
) -> FsOpStep:
    """A file operation under the run's ``fs_policy`` roots."""
    return FsOpStep(
        type="fs_op",
        client_token=client_token or new_token(),
        input=FsOpInput(op=op, path=path, content=content),
    )
