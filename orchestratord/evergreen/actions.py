"""Actions as steps: what each action takes and makes, and the step it submits.

- ``GENERATE``: an ``llm_call``. Input ``prompt`` (or ``text``): the prompt
  (``prompts.llm_input``); output ``response`` (or ``text``): the step's tokens, streamed
  as they come. ``configs``: :class:`GenerateConfig` (``orchestratord.evergreen.v1``) in
  ``Any``. ``target_spec.id``: a pool id pins the step there; anything else names the model.
- ``PLAN``: an ``llm_plan`` with the same input and configs; output ``suggestions``: the
  plan, one ``application/json`` chunk.
- An action named like one of the flow's tools: a ``tool_call``. Input ``args``: JSON
  object chunks (``application/json``); output ``result``: the tool's answer, one
  ``application/json`` chunk.

Unknown parameters, configs of another type and a missing input abort the session naming
them (``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestratord.evergreen.nodes import Leaf, SessionAbort
from orchestratord.evergreen.prompts import MODEL_ROLE, llm_input

CONFIG_TYPE = "orchestratord.evergreen.v1.GenerateConfig"
JSON = "application/json"


@dataclass(frozen=True)
class Param:
    name: str
    id: str


@dataclass(frozen=True)
class ActionCall:
    """An action as received, in plain values."""

    name: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    configs: tuple[tuple[str, bytes], ...]  # (type_url, value) of each Any
    target: str  # target_spec.id ("" : none)


@dataclass(frozen=True)
class Planned:
    """The step an action submits, and where its output goes."""

    step_type: str
    step_input: dict[str, Any]
    placement: dict[str, Any] | None
    input_param: str  # the input it reads (named in errors)
    input_id: str
    output_id: str | None  # None: the caller does not want the output
    streamed: bool  # tokens as they come (else one JSON chunk once the step ends)

    @property
    def output_role(self) -> str:
        """The role its output carries: ``model`` for an answer to a conversation (a later
        input naming it stays a conversation); none for an answer to a plain prompt (a
        later input naming it stays plain text, which a session-bound engine extends)."""
        return MODEL_ROLE if "messages" in self.step_input else ""


class ActionKind(abc.ABC):
    """One kind of action: its parameter names and the step it makes."""

    inputs: tuple[str, ...] = ()  # accepted input names, the first preferred
    outputs: tuple[str, ...] = ()
    step_type = ""
    streamed = False
    # what ``target_spec.id`` may name beside a pool: a model (engine steps) or nothing
    target_names_model = True

    @abc.abstractmethod
    def plan(
        self, call: ActionCall, param: Param, leaves: list[Leaf], ctx: PlanContext
    ) -> dict[str, Any]:
        """The step's input, read from the action's input leaves."""


@dataclass(frozen=True)
class PlanContext:
    run_seed: int
    unpack: Callable[[bytes], Any]  # a GenerateConfig's bytes -> the message
    tools: tuple[str, ...] = ()  # the flow's tools, by name


def config_params(config: Any, action: str) -> dict[str, Any]:
    """A ``GenerateConfig``'s generation parameters, as a step's ``input.params`` names them
    (its ``seed`` is the caller's to check)."""
    params: dict[str, Any] = {}
    for name in ("max_tokens", "top_k"):
        if config.HasField(name):
            params[name] = getattr(config, name)
    for name in ("temperature", "top_p"):  # float32 on the wire: 0.7 arrives as 0.699999988
        if config.HasField(name):
            params[name] = round(float(getattr(config, name)), 6)
    if config.stop:
        params["stop"] = list(config.stop)
    if config.json_schema:
        try:
            params["json_schema"] = json.loads(config.json_schema)
        except json.JSONDecodeError as exc:
            raise SessionAbort(
                "INVALID_ARGUMENT", f"action {action!r}: json_schema is not JSON: {exc}"
            ) from None
    return params


def known_config(type_url: str, action: str) -> None:
    """Refuses a config of a type this server does not take, naming it."""
    if type_url.rsplit("/", 1)[-1] != CONFIG_TYPE:
        raise SessionAbort(
            "INVALID_ARGUMENT",
            f"action {action!r}: config {type_url!r} is not known (this server takes"
            f" type.googleapis.com/{CONFIG_TYPE})",
        )


def _params(call: ActionCall, ctx: PlanContext) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for type_url, value in call.configs:
        known_config(type_url, call.name)
        config = ctx.unpack(value)
        params.update(config_params(config, call.name))
        if config.HasField("seed") and config.seed != ctx.run_seed:
            raise SessionAbort(
                "INVALID_ARGUMENT",
                f"action {call.name!r}: seed {config.seed} is not the run's ({ctx.run_seed}):"
                " a session's seed is its run's (x-run)",
            )
    return params


class Generate(ActionKind):
    inputs: tuple[str, ...] = ("prompt", "text")
    outputs: tuple[str, ...] = ("response", "text")
    step_type = "llm_call"
    streamed = True

    def plan(
        self, call: ActionCall, param: Param, leaves: list[Leaf], ctx: PlanContext
    ) -> dict[str, Any]:
        body = llm_input(leaves, param.name)
        body["params"] = _params(call, ctx)
        return body


class Plan(Generate):
    """Offers the model every tool of the flow."""

    outputs = ("suggestions",)
    step_type = "llm_plan"
    streamed = False

    def plan(
        self, call: ActionCall, param: Param, leaves: list[Leaf], ctx: PlanContext
    ) -> dict[str, Any]:
        if not ctx.tools:
            raise SessionAbort("INVALID_ARGUMENT", "PLAN needs a flow with tools to offer")
        return {**super().plan(call, param, leaves, ctx), "tools": list(ctx.tools)}


class ToolAction(ActionKind):
    inputs = ("args",)
    outputs = ("result",)
    step_type = "tool_call"
    target_names_model = False

    def plan(
        self, call: ActionCall, param: Param, leaves: list[Leaf], ctx: PlanContext
    ) -> dict[str, Any]:
        if call.configs:
            raise SessionAbort("INVALID_ARGUMENT", f"tool action {call.name!r} takes no configs")
        for leaf in leaves:
            if leaf.ref is not None or leaf.mimetype.split(";")[0].strip().lower() != JSON:
                raise SessionAbort(
                    "INVALID_ARGUMENT",
                    f"tool action {call.name!r}: input 'args' node {leaf.node_id!r} is"
                    f" {leaf.mimetype!r}, not inline {JSON}",
                )
        text = b"".join(leaf.data for leaf in leaves) or b"{}"
        try:
            args = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SessionAbort(
                "INVALID_ARGUMENT", f"tool action {call.name!r}: args are not JSON: {exc}"
            ) from None
        if not isinstance(args, dict):
            raise SessionAbort(
                "INVALID_ARGUMENT", f"tool action {call.name!r}: args must be a JSON object"
            )
        return {"tool": call.name, "args": args}


BUILT_IN: dict[str, ActionKind] = {"GENERATE": Generate(), "PLAN": Plan()}


def kind_of(name: str, tools: Sequence[str]) -> ActionKind:
    """The kind of an action by its name: a built-in one, or a tool of the flow."""
    found = BUILT_IN.get(name)
    if found is not None:
        return found
    if name in tools:
        return ToolAction()
    known = ", ".join([*BUILT_IN, *sorted(tools)])
    raise SessionAbort("INVALID_ARGUMENT", f"unknown action {name!r} (this session's: {known})")


def _one(
    call: ActionCall, given: tuple[Param, ...], names: tuple[str, ...], what: str
) -> Param | None:
    for p in given:
        if p.name not in names:
            raise SessionAbort(
                "INVALID_ARGUMENT",
                f"action {call.name!r} has no {what} {p.name!r} (its {what}s: {', '.join(names)})",
            )
    if len(given) > 1:
        raise SessionAbort(
            "INVALID_ARGUMENT", f"action {call.name!r} takes one {what}, not {len(given)}"
        )
    return given[0] if given else None


def input_of(call: ActionCall, kind: ActionKind) -> Param:
    found = _one(call, call.inputs, kind.inputs, "input")
    if found is None:
        raise SessionAbort(
            "INVALID_ARGUMENT", f"action {call.name!r} needs an input {kind.inputs[0]!r}"
        )
    return found


def output_of(call: ActionCall, kind: ActionKind) -> Param | None:
    return _one(call, call.outputs, kind.outputs, "output")


def plan(
    call: ActionCall,
    kind: ActionKind,
    leaves: list[Leaf],
    ctx: PlanContext,
    pools: Sequence[str],
) -> Planned:
    """The step ``call`` submits, its input's leaves read."""
    param = input_of(call, kind)
    output = output_of(call, kind)
    step_input = kind.plan(call, param, leaves, ctx)
    placement = None
    if call.target:
        if call.target in pools:
            placement = {"pin": call.target}
        elif kind.target_names_model:
            step_input["model"] = call.target
        else:
            raise SessionAbort(
                "NOT_FOUND", f"target_spec.id {call.target!r} is not a pool of this server"
            )
    return Planned(
        step_type=kind.step_type,
        step_input=step_input,
        placement=placement,
        input_param=param.name,
        input_id=param.id,
        output_id=None if output is None else output.id,
        streamed=kind.streamed,
    )
