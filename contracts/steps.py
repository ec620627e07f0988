"""Step requests and views. ``StepCreate`` is a union discriminated on ``type``: each kind
documents its own ``input`` in the OpenAPI document, and bad input names ``input.<field>``.

A kind is named once, by the ``type`` of its request (``LlmCallStep``); adding one is adding
its request to ``AnyStepCreate``: the list of step types is read from that union."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from contracts.bounds import MAX_INT, MAX_TOP_K, Text
from contracts.common import Budgets, Out, Placement, Strict
from contracts.runs import Usage


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class LlmParams(Strict):
    max_tokens: int | None = Field(default=None, ge=1, le=131072)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K, description="0..2^31-1")
    stop: list[str] | None = Field(default=None, max_length=16)
    logprobs: bool | None = Field(default=None, description="report log p of each token")
    json_schema: dict[str, Any] | None = Field(
        default=None, description="constrain the output to JSON matching this schema"
    )


class LlmCallInput(Strict):
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    params: LlmParams = Field(default_factory=LlmParams)
    model: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> LlmCallInput:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


def _derived(properties: dict[str, JsonDict]) -> Callable[[JsonDict], None]:
    """Properties the server adds to a kind's stored input (``StepOut.input``), documented
    ``readOnly``: a request does not send them (one that does is refused as an unknown
    field), and a client repeating a recorded step leaves them out."""

    def add(schema: JsonDict) -> None:
        props = schema.setdefault("properties", {})
        assert isinstance(props, dict)
        props.update({name: {**prop, "readOnly": True} for name, prop in properties.items()})

    return add


class LlmPlanInput(LlmCallInput):
    model_config = ConfigDict(
        json_schema_extra=_derived(
            {
                "tool_specs": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "the offered tools as the step was planned against "
                    "(name, description, parameters), resolved from the flow",
                },
                "template": {
                    "type": "string",
                    "description": "the version of the plan prompt's template",
                },
            }
        )
    )

    tools: list[str] = Field(
        min_length=1,
        max_length=64,
        description="names of the flow's tools offered to the model; each suggestion is "
        "validated against its tool's parameters",
    )


class ToolCallInput(Strict):
    tool: str = Field(min_length=1, description="a tool of the run's flow, by name")
    args: dict[str, Any] = Field(
        default_factory=dict, description="validated against the tool's JSON Schema"
    )


class FsOpInput(Strict):
    op: Literal["read", "write", "list", "stat", "delete"]
    path: str = Field(min_length=1)
    content: str | None = None


class GateEvalInput(Strict):
    expr: str = Field(min_length=1, description="a CEL expression over the run's facts")
    wait_ms: int | None = Field(default=None, ge=0, le=MAX_INT, description="0..2^53-1")


class CheckpointInput(Strict):
    state: dict[str, Any]


class _StepCreateBase(Strict):
    client_token: Text = Field(min_length=1, max_length=256)
    budgets: Budgets | None = None
    placement: Placement | None = None
    cancel_on_disconnect: bool | None = None
    priority: Literal["interactive", "batch"] = "interactive"


class LlmCallStep(_StepCreateBase):
    type: Literal["llm_call"]
    input: LlmCallInput


class LlmPlanStep(_StepCreateBase):
    type: Literal["llm_plan"]
    input: LlmPlanInput


class ToolCallStep(_StepCreateBase):
    type: Literal["tool_call"]
    input: ToolCallInput


class FsOpStep(_StepCreateBase):
    type: Literal["fs_op"]
    input: FsOpInput


class GateEvalStep(_StepCreateBase):
    type: Literal["gate_eval"]
    input: GateEvalInput


class CheckpointStep(_StepCreateBase):
    type: Literal["checkpoint"]
    input: CheckpointInput


AnyStepCreate = LlmCallStep | LlmPlanStep | ToolCallStep | FsOpStep | GateEvalStep | CheckpointStep
StepCreate = Annotated[AnyStepCreate, Field(discriminator="type")]
STEP_TYPES: tuple[str, ...] = tuple(
    name
    for request in get_args(AnyStepCreate)
    for name in get_args(request.model_fields["type"].annotation)
)
if TYPE_CHECKING:  # a literal built from a tuple is a runtime type, not a static one
    StepType = str
else:
    StepType = Literal[STEP_TYPES]


class StepAccepted(Out):
    step_id: str
    status: str


class PlacementChoice(BaseModel):
    pool_id: str
    replica_id: str | None = Field(description="null until the step runs")


class PlacementCandidate(BaseModel):
    pool_id: str
    replica_id: str | None
    eligible: bool
    reason: str | None = Field(description="why it was not eligible; null when it was")
    free_slots: int


class PlacementDecision(BaseModel):
    rule: str = Field(description="auto | pin | affinity | replay")
    tie_break: str | None = None
    chosen: PlacementChoice
    candidates: list[PlacementCandidate] = Field(default_factory=list)
    moved_from: str | None = Field(
        default=None,
        description="the pool it was queued on, when that pool's replicas all stopped taking"
        " steps and it was placed again",
    )


class StepOut(Out):
    step_id: str
    run_id: str
    position: int
    type: StepType
    client_token: str
    status: str
    cancel_requested: bool
    input: dict[str, Any]
    budgets: dict[str, Any] | None
    placement: Any
    pool_id: str | None
    replica_id: str | None
    output: dict[str, Any] | None
    priority: str
    usage: Usage
    reserved: Usage
    max_tokens_granted: int | None = Field(description="max_tokens after the budget clamp")
    budget_clamped: bool
    policy_decision: dict[str, Any] | None
    placement_decision: PlacementDecision | None = Field(
        default=None,
        description="engine steps: the placement rule, every candidate replica and its reason,"
        " and the pool and replica chosen (the replica once the step runs)",
    )
    provenance: dict[str, Any] | None
    error: dict[str, Any] | None
    replay_of: str | None = Field(
        default=None, description="replay runs: the recorded step this one reproduces"
    )
    replay_outcome: str | None = Field(
        default=None,
        description="replay runs, once ended: identical | diverged | miss | failed | cancelled",
    )
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
