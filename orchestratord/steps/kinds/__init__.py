"""The registry of step kinds: adding a kind is one module and one line below."""

from __future__ import annotations

from orchestrator_core.errors import Unsupported
from orchestratord.steps.kinds.base import StepKind
from orchestratord.steps.kinds.checkpoint import CheckpointStep
from orchestratord.steps.kinds.fs_op import FsOp
from orchestratord.steps.kinds.gate_eval import GateEval
from orchestratord.steps.kinds.llm_call import LlmCall
from orchestratord.steps.kinds.llm_plan import LlmPlan
from orchestratord.steps.kinds.tool_call import ToolCall

KINDS: dict[str, StepKind] = {
    kind.step_type: kind
    for kind in (LlmCall(), LlmPlan(), ToolCall(), CheckpointStep(), GateEval(), FsOp())
}


def kind_of(step_type: str) -> StepKind:
    """The kind serving ``step_type``; a type the contract names but no kind serves yet is
    refused with 501 naming the field."""
    kind = KINDS.get(step_type)
    if kind is None:
        raise Unsupported(
            f"step type {step_type!r} is not served yet",
            details={"field": "type", "supported": sorted(KINDS)},
        )
    return kind
