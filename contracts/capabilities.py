"""The capability snapshot: what the deployment serves, for clients that generate code from it.

``GET /v1/capabilities`` (and ``GET /capabilities``) answers one :class:`CapabilitySnapshot`,
the shape the ``nrv sync-capabilities`` CLI reads: ``metadata``, ``limits``, ``workloads``,
``models``, ``hardware``, ``tools`` and ``captured_at``. Every array is sorted by its key
(``workloads`` by ``workload``, ``models`` by ``id``, ``hardware.gpus`` by ``id``, ``tools``
by ``name``, each ``supported_models`` as text) so that code generated from two snapshots of
the same deployment is the same; a field that is not known is left out rather than null.

``metadata.version`` is the snapshot format's version (``YYYY.MM``), bumped when a field is
added or changes meaning; ``metadata.build`` is the server's version.

The JSON Schema of the snapshot is kept beside this module, ``capabilities.schema.json``:
``python -m contracts.capabilities [--check]`` writes it (or fails when it drifted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.generated import write_or_check

SNAPSHOT_VERSION = "2026.11"
SCHEMA_PATH = Path(__file__).with_name("capabilities.schema.json")

U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
U16 = Annotated[int, Field(ge=0, le=2**16 - 1)]
WorkloadKind = Literal["chat", "completion", "tool", "embedding", "audio"]
ModelModality = Literal["text", "multimodal", "audio", "vision"]
UTC_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OrchestratorMetadata(_Part):
    engine: str = Field(description="the server answering: orchestratord")
    version: str = Field(pattern=r"^\d{4}\.\d{2}$", description="the snapshot format, YYYY.MM")
    build: str | None = Field(default=None, description="the server's version")
    commit: str | None = None


class Limits(_Part):
    ctx_max: U32 = Field(description="the largest context of any model, tokens; 0: none known")
    max_tokens_out: U32 | None = Field(default=None, description="the most max_tokens takes")
    max_concurrent_requests: U32 | None = Field(
        default=None, description="engine requests at once: every replica's slots"
    )
    queue_depth_limit: U32 | None = Field(
        default=None, description="queued steps the deployment holds before it refuses"
    )


class WorkloadCapability(_Part):
    workload: WorkloadKind
    supported_models: list[str]
    default_model: str | None = Field(default=None, description="set when one model serves it")
    supports_guardrails: bool = Field(description="steps pass the run's policy and budgets")

    @model_validator(mode="after")
    def _sorted(self) -> WorkloadCapability:
        self.supported_models = sorted(set(self.supported_models))
        return self


class ModelCapability(_Part):
    id: str = Field(description="the name a step's model field takes")
    display_name: str | None = None
    family: str | None = None
    modality: ModelModality
    ctx_max: U32 = Field(description="the largest context it is served with; 0: not reported")
    max_tokens_out: U32 | None = None
    supports_tool_calls: bool = Field(description="llm_plan: a plan of the flow's tool calls")
    supports_parallel_functions: bool = Field(description="several calls in one answer")
    inference_units_per_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class GpuInfo(_Part):
    id: str = Field(description="<pool_id>/<replica_id>/gpu<N>: what placement selectors name")
    vendor: str
    name: str
    memory_gb: U32
    driver: str | None = None
    arch: str | None = None


class CpuInfo(_Part):
    model: str
    cores: U16
    threads: U16


class HardwareInventory(_Part):
    gpus: list[GpuInfo]
    cpus: list[CpuInfo] | None = None

    @model_validator(mode="after")
    def _sorted(self) -> HardwareInventory:
        self.gpus = sorted(self.gpus, key=lambda g: g.id)
        return self


class ToolCapability(_Part):
    name: str
    description: str | None = None
    input_schema: str | None = Field(default=None, description="a JSON Schema, as text")
    returns_schema: str | None = Field(default=None, description="a JSON Schema, as text")
    timeout_ms: U32 | None = None


class CapabilitySnapshot(_Part):
    """What the deployment serves, built from its pools when asked."""

    metadata: OrchestratorMetadata
    limits: Limits
    workloads: list[WorkloadCapability]
    models: list[ModelCapability]
    hardware: HardwareInventory
    tools: list[ToolCapability] | None = Field(
        default=None, description="tools the server hosts (flows declare their own)"
    )
    captured_at: str = Field(pattern=UTC_TIMESTAMP, description="ISO 8601, UTC")

    @model_validator(mode="after")
    def _sorted(self) -> CapabilitySnapshot:
        self.workloads = sorted(self.workloads, key=lambda w: w.workload)
        self.models = sorted(self.models, key=lambda m: m.id)
        if self.tools is not None:
            self.tools = sorted(self.tools, key=lambda t: t.name)
        return self


def json_schema() -> dict[str, Any]:
    """The snapshot's JSON Schema (draft 2020-12), as answered (``None`` fields left out)."""
    schema = CapabilitySnapshot.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(SCHEMA_PATH, render(), argv, module="contracts.capabilities")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
