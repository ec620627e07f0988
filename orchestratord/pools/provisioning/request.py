"""The body of ``POST /v1/pools/provision``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestratord.pools.config import GpuSpec


class ProvisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool_id: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$", description="the new pool"
    )
    provisioner: str = Field(
        min_length=1,
        max_length=64,
        description="how its engines start: `llama` (in this process), `llama_cpp_server` (a"
        " llama_cpp.server child process per replica) or a command named in the"
        " `provision.commands` setting",
    )
    replicas: int = Field(default=1, ge=1, le=64, description="engines to start")
    slots: int = Field(default=1, ge=1, le=4096, description="concurrent requests per engine")
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="llama provisioners: a GGUF file on this host (default: the packaged"
        " model); a command: its `{model}`",
    )
    tags: dict[str, str] = Field(default_factory=dict, description="the pool's tags")
    gpu: GpuSpec | None = Field(default=None, description="the GPUs each engine runs on")
    idle_ttl_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="remove the pool after this long with no step; default: the"
        " `provision.idle_ttl_s` setting; 0: never",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the provisioner's own: `n_ctx` (llama provisioners)",
    )
