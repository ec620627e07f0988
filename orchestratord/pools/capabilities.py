"""What the pools serve, as shown: per replica and pool in ``GET /v1/pools``, and as the
capability snapshot (``contracts.capabilities``) of ``GET /v1/capabilities``.

A replica serves the model named for it in the pools file and those its engine reports;
its context size and features are what its engine reports; its GPUs are declared in the
pools file (``pools/config.py``). A pool shows the union of its replicas' models, the
features every replica offers (what placement counts on), the smallest context size and its
GPUs summed. The snapshot is built from the pools when asked:

- ``models``: every model a pool serves, with the largest context it is served with, tool
  calls where its pool constrains output to a JSON Schema (``llm_plan`` asks for a plan of
  several calls that way), ``multimodal`` where an engine reports ``images``;
- ``workloads``: ``chat`` and ``completion`` (``llm_call`` with ``messages`` or a
  ``prompt``) for every model, ``tool`` for the models with tool calls;
- ``hardware.gpus``: one entry per declared GPU, named ``<pool_id>/<replica_id>/gpu<N>``;
- ``limits``: the largest context, the API's bound on ``max_tokens``, every replica's
  slots, and the admission queues' capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contracts.capabilities import (
    SNAPSHOT_VERSION,
    CapabilitySnapshot,
    GpuInfo,
    HardwareInventory,
    Limits,
    ModelCapability,
    OrchestratorMetadata,
    WorkloadCapability,
    WorkloadKind,
)
from contracts.steps import LlmParams
from orchestratord import __version__

if TYPE_CHECKING:
    from orchestratord.pools.registry import Pool, Replica

# what a replica's engine says of itself that is shown per replica (the rest, addresses
# among it, is shown scrubbed at the pool's level only)
_IDENTITY = ("engine", "engine_version", "model", "model_hash", "quantization")
TOOL_FEATURE = "json_schema"  # llm_plan constrains its answer to a schema of tool calls
IMAGE_FEATURES = frozenset({"images", "vision"})


def max_tokens_bound() -> int:
    """The most ``params.max_tokens`` takes."""
    for bound in LlmParams.model_fields["max_tokens"].metadata:
        if (le := getattr(bound, "le", None)) is not None:
            return int(le)
    raise AssertionError("LlmParams.max_tokens has no upper bound")


def replica_context(replica: Replica) -> int | None:
    """The context size its engine reported; None before it did (or when it reports 0)."""
    size = replica.capabilities.get("context_size")
    return size if isinstance(size, int) and size > 0 else None


def replica_capabilities(replica: Replica) -> dict[str, Any]:
    return {
        **{k: replica.capabilities[k] for k in _IDENTITY if k in replica.capabilities},
        "models": sorted(replica.models),
        "features": sorted(replica.features),
        "context_size": replica_context(replica),
        "gpu": None if replica.gpu is None else replica.gpu.shown(),
    }


def pool_gpu(pool: Pool) -> dict[str, Any] | None:
    """The pool's GPUs summed: their count, the smallest memory and the arch they share
    (null when they differ); null unless every replica declares its GPUs."""
    declared = [r.gpu for r in pool.replicas]
    gpus = [g for g in declared if g is not None]
    if not gpus or len(gpus) != len(declared):
        return None
    arches = {g.arch for g in gpus}
    return {
        "arch": arches.pop() if len(arches) == 1 else None,
        "vram_gib": pool.vram_gib,
        "count": sum(g.count for g in gpus),
    }


def pool_capabilities(pool: Pool) -> dict[str, Any]:
    """What the pool's engine reported (its first replica's), with the pool's models,
    features, context size and GPUs."""
    contexts = [c for r in pool.replicas if (c := replica_context(r)) is not None]
    return {
        **pool.capabilities,
        "models": sorted(pool.models),
        "features": sorted(pool.features or ()),
        "context_size": min(contexts) if contexts else None,
        "gpu": pool_gpu(pool),
    }


def snapshot(
    pools: Iterable[Pool], *, queue_depth_limit: int | None, captured_at: datetime
) -> CapabilitySnapshot:
    """The capability snapshot of ``pools`` at ``captured_at``."""
    pools = list(pools)
    contexts: dict[str, int] = {}
    tool_models: set[str] = set()
    image_models: set[str] = set()
    gpus: list[GpuInfo] = []
    for pool in pools:
        offered = pool.features or frozenset()
        for model in pool.models:
            contexts.setdefault(model, 0)
            if TOOL_FEATURE in offered:
                tool_models.add(model)
        for replica in pool.replicas:
            for model in replica.models:
                contexts[model] = max(contexts.get(model, 0), replica_context(replica) or 0)
                if replica.features & IMAGE_FEATURES:
                    image_models.add(model)
            gpu = replica.gpu
            if gpu is not None:
                gpus += [
                    GpuInfo(
                        id=gpu_id,
                        vendor=gpu.vendor_name,
                        name=gpu.display_name,
                        memory_gb=gpu.vram_gib,
                        driver=gpu.driver,
                        arch=gpu.arch,
                    )
                    for gpu_id in replica.gpu_ids
                ]
    bound = max_tokens_bound()
    models = [
        ModelCapability(
            id=model,
            modality="multimodal" if model in image_models else "text",
            ctx_max=ctx,
            max_tokens_out=min(ctx, bound) if ctx else None,
            supports_tool_calls=model in tool_models,
            supports_parallel_functions=model in tool_models,
        )
        for model, ctx in contexts.items()
    ]
    served: dict[WorkloadKind, set[str]] = {
        "chat": set(contexts),
        "completion": set(contexts),
        "tool": tool_models,
    }
    workloads = [
        WorkloadCapability(
            workload=workload,
            supported_models=sorted(ids),
            default_model=next(iter(ids)) if len(ids) == 1 else None,
            supports_guardrails=True,
        )
        for workload, ids in served.items()
        if ids
    ]
    return CapabilitySnapshot(
        metadata=OrchestratorMetadata(
            engine="orchestratord", version=SNAPSHOT_VERSION, build=__version__
        ),
        limits=Limits(
            ctx_max=max(contexts.values(), default=0),
            max_tokens_out=bound,
            max_concurrent_requests=sum(r.slots for p in pools for r in p.replicas),
            queue_depth_limit=queue_depth_limit,
        ),
        workloads=workloads,
        models=models,
        hardware=HardwareInventory(gpus=gpus),
        tools=[],
        captured_at=_utc(captured_at),
    )


def _utc(moment: datetime) -> str:
    at = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
