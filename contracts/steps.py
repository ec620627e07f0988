"""Step requests and views. ``StepCreate`` is a union discriminated on ``type``: each kind
documents its own ``input`` in the OpenAPI document, and bad input names ``input.<field>``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

from contracts.bounds import MAX_INT, MAX_TOP_K, Text
from contracts.common import Budgets, Out, Placement, Strict
from contracts.runs import Usage

StepType = Literal["llm_plan", "llm_call", "tool_call", "fs_op", "gate_eval", "checkpoint"]
STEP_TYPES: tuple[str, ...] = get_args(StepType)


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


class LlmPlanInput(LlmCallInput):
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


StepCreate = Annotated[
    LlmCallStep | LlmPlanStep | ToolCallStep | FsOpStep | GateEvalStep | CheckpointStep,
    Field(discriminator="type"),
]
AnyStepCreate = LlmCallStep | LlmPlanStep | ToolCallStep | FsOpStep | GateEvalStep | CheckpointStep


class StepAccepted(Out):
    step_id: str
    status: str


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
