"""Every route of the v1 API, once: the blocking and the async client both inherit
:class:`Routes` (each entry builds its request; the client's transport sends it).

Request bodies are the contract's models (``contracts.*``) or mappings of the same shape,
checked before anything is sent. Writes an interpreter retries carry a ``client_token``: one
is made when the body has none, before the first try, so every retry sends the same.
Pools are written as ``pools.yaml`` writes them (a mapping): their checks are the server's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from contracts.capabilities import CapabilitySnapshot
from contracts.flows import FlowCreate, FlowCreated, FlowOut
from contracts.records import CheckpointCreate, CheckpointOut, FactCreate, FactOut, PoolOut
from contracts.replay import ReplayReport
from contracts.runs import CancelOut, RunComplete, RunCreate, RunFork, RunOut
from contracts.steps import AnyStepCreate, StepAccepted, StepCreate, StepOut
from contracts.transfer import RunBundle
from orchestrator_client.calls import (
    Call,
    body_of,
    dump,
    items,
    model,
    new_token,
    nothing,
    route,
    text,
    tokened,
)
from orchestrator_client.errors import InvalidRequest
from orchestrator_client.sse import TERMINAL
from orchestrator_client.streams import Start, stream_route

Body = BaseModel | Mapping[str, Any]
_STEP: TypeAdapter[AnyStepCreate] = TypeAdapter(StepCreate)


def step_body(step: AnyStepCreate | Mapping[str, Any]) -> AnyStepCreate:
    """A step request as the contract's model; a mapping without ``client_token`` gets one."""
    if isinstance(step, BaseModel):
        return step
    if "client_token" not in step:
        step = {**step, "client_token": new_token()}
    try:
        return _STEP.validate_python(step)
    except ValidationError as exc:  # its locations start with the step type: not on the wire
        raise InvalidRequest.of(exc, tagged="type" in step) from None


def _write(kind: type[BaseModel], value: Body) -> Any:
    return dump(tokened(body_of(value, kind)))


class Routes:
    """The v1 API (CONTRACT.md). Answers are the contract's models."""

    # --- health and capabilities

    @route("GET", "/healthz")
    def healthz() -> Call[dict[str, str]]:
        """``{"status": "ok", "version"}``."""
        return Call(TypeAdapter(dict[str, str]).validate_json)

    @route("GET", "/metrics")
    def metrics() -> Call[str]:
        """The Prometheus text exposition."""
        return Call(text)

    @route("GET", "/v1/capabilities")
    def capabilities() -> Call[CapabilitySnapshot]:
        """Models, workloads, limits and hardware this server offers."""
        return Call(model(CapabilitySnapshot))

    @route("GET", "/capabilities")
    def capabilities_unversioned() -> Call[CapabilitySnapshot]:
        """The same snapshot at the path the interpreter's CLI calls."""
        return Call(model(CapabilitySnapshot))

    # --- flows

    @route("POST", "/v1/flows")
    def create_flow(flow: FlowCreate | Mapping[str, Any]) -> Call[FlowCreated]:
        """Store a flow; the same content answers the same ``flow_id`` (safe to repeat)."""
        return Call(model(FlowCreated), body=dump(body_of(flow, FlowCreate)))

    @route("GET", "/v1/flows/{flow_id}")
    def get_flow(flow_id: str) -> Call[FlowOut]:
        return Call(model(FlowOut), path={"flow_id": flow_id})

    @route("GET", "/v1/flows:by-hash/{content_hash}")
    def get_flow_by_hash(content_hash: str) -> Call[FlowOut]:
        return Call(model(FlowOut), path={"content_hash": content_hash})

    @route("GET", "/v1/flows/{flow_id}/facts")
    def list_flow_facts(
        flow_id: str, *, type: str | None = None, after: str | None = None, limit: int = 100
    ) -> Call[list[FactOut]]:
        """Facts of every run of the flow, in append order; ``after``: the last fact_id read."""
        return Call(
            items(FactOut),
            path={"flow_id": flow_id},
            query={"type": type, "after": after, "limit": limit},
        )

    # --- runs

    @route("POST", "/v1/flows/{flow_id}/runs")
    def create_run(flow_id: str, run: RunCreate | Mapping[str, Any] | None = None) -> Call[RunOut]:
        """A new run (record by default); retried with the same ``client_token``."""
        return Call(model(RunOut), path={"flow_id": flow_id}, body=_write(RunCreate, run or {}))

    @route("GET", "/v1/runs")
    def list_runs(
        *,
        flow_id: str | None = None,
        status: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> Call[list[RunOut]]:
        """Newest first; ``after``: the last run_id of the previous page."""
        query = {"flow_id": flow_id, "status": status, "after": after, "limit": limit}
        return Call(items(RunOut), query=query)

    @route("GET", "/v1/runs/{run_id}")
    def get_run(run_id: str) -> Call[RunOut]:
        """Status, seed, mode, budgets and their usage."""
        return Call(model(RunOut), path={"run_id": run_id})

    @route("POST", "/v1/runs/{run_id}/complete")
    def complete_run(
        run_id: str, status: str = "succeeded", output: dict[str, Any] | None = None
    ) -> Call[RunOut]:
        """End the run (the interpreter's last word); repeating it answers the same run."""
        body = body_of({"status": status, "output": output}, RunComplete)
        return Call(model(RunOut), path={"run_id": run_id}, body=dump(body))

    @route("POST", "/v1/runs/{run_id}/cancel")
    def cancel_run(run_id: str) -> Call[CancelOut]:
        """Cancel every live step and end the run ``cancelled`` (safe to repeat)."""
        return Call(model(CancelOut), path={"run_id": run_id})

    @route("POST", "/v1/runs/{run_id}/fork")
    def fork_run(
        run_id: str, checkpoint_id: str, *, client_token: str | None = None
    ) -> Call[RunOut]:
        """A new record run from a checkpoint of this one."""
        fork = RunFork(checkpoint_id=checkpoint_id, client_token=client_token)
        return Call(model(RunOut), path={"run_id": run_id}, body=_write(RunFork, fork))

    @route("GET", "/v1/runs/{run_id}/replay-report")
    def replay_report(run_id: str) -> Call[ReplayReport]:
        """A replay run against its record: per step identical, diverged (where), missed."""
        return Call(model(ReplayReport), path={"run_id": run_id})

    @route("GET", "/v1/runs/{run_id}/export")
    def export_run(run_id: str) -> Call[RunBundle]:
        """The ended run as a bundle another server imports."""
        return Call(model(RunBundle), path={"run_id": run_id})

    @route("POST", "/v1/runs:import")
    def import_run(bundle: RunBundle | Mapping[str, Any]) -> Call[RunOut]:
        """Store an exported run (the same bundle again answers the same run)."""
        return Call(model(RunOut), body=dump(body_of(bundle, RunBundle)))

    # --- steps

    @route("POST", "/v1/runs/{run_id}/steps")
    def submit_step(run_id: str, step: AnyStepCreate | Mapping[str, Any]) -> Call[StepAccepted]:
        """Queue a step; the same ``client_token`` in the run answers the first step."""
        return Call(model(StepAccepted), path={"run_id": run_id}, body=dump(step_body(step)))

    @route("GET", "/v1/runs/{run_id}/steps")
    def list_steps(run_id: str) -> Call[list[StepOut]]:
        """The run's steps by position."""
        return Call(items(StepOut), path={"run_id": run_id})

    @route("GET", "/v1/steps/{step_id}")
    def get_step(step_id: str) -> Call[StepOut]:
        """Status, output, usage, placement decision and provenance."""
        return Call(model(StepOut), path={"step_id": step_id})

    @route("POST", "/v1/steps/{step_id}/cancel")
    def cancel_step(step_id: str) -> Call[CancelOut]:
        return Call(model(CancelOut), path={"step_id": step_id})

    # --- facts and checkpoints

    @route("POST", "/v1/runs/{run_id}/facts")
    def add_fact(run_id: str, fact: FactCreate | Mapping[str, Any]) -> Call[FactOut]:
        """Append a fact; retried with the same ``client_token``."""
        return Call(model(FactOut), path={"run_id": run_id}, body=_write(FactCreate, fact))

    @route("GET", "/v1/runs/{run_id}/facts")
    def list_facts(
        run_id: str, *, type: str | None = None, after: str | None = None, limit: int = 100
    ) -> Call[list[FactOut]]:
        """In append order; ``after``: the last fact_id read."""
        return Call(
            items(FactOut),
            path={"run_id": run_id},
            query={"type": type, "after": after, "limit": limit},
        )

    @route("POST", "/v1/runs/{run_id}/checkpoint")
    def checkpoint(
        run_id: str, checkpoint: CheckpointCreate | Mapping[str, Any]
    ) -> Call[CheckpointOut]:
        """Store the interpreter's state with the server's cursors."""
        body = _write(CheckpointCreate, checkpoint)
        return Call(model(CheckpointOut), path={"run_id": run_id}, body=body)

    @route("GET", "/v1/runs/{run_id}/checkpoints")
    def list_checkpoints(run_id: str) -> Call[list[CheckpointOut]]:
        return Call(items(CheckpointOut), path={"run_id": run_id})

    # --- pools

    @route("GET", "/v1/pools")
    def list_pools() -> Call[list[PoolOut]]:
        """Pools with replicas, health, capabilities and load."""
        return Call(items(PoolOut))

    @route("GET", "/v1/pools/{pool_id}")
    def get_pool(pool_id: str) -> Call[PoolOut]:
        return Call(model(PoolOut), path={"pool_id": pool_id})

    @route("POST", "/v1/pools")
    def create_pool(pool: Mapping[str, Any]) -> Call[PoolOut]:
        """A pool as ``pools.yaml`` writes one (admin); the same body again is safe."""
        return Call(model(PoolOut), body=dict(pool))

    @route("POST", "/v1/pools/provision")
    def provision_pool(request: Mapping[str, Any]) -> Call[PoolOut]:
        """Start engines and make a pool of them (admin): ``{"pool_id", "provisioner",
        "replicas", "slots", "model", "tags", "options"}``; the same body again answers the
        pool."""
        return Call(model(PoolOut), body=dict(request))

    @route("DELETE", "/v1/pools/{pool_id}")
    def delete_pool(pool_id: str) -> Call[None]:
        """Remove a pool made through the API (admin)."""
        return Call(nothing, path={"pool_id": pool_id})

    @route("POST", "/v1/pools/{pool_id}/replicas/{replica_id}/drain")
    def drain_replica(pool_id: str, replica_id: str) -> Call[PoolOut]:
        """Stop placing steps on the replica; running ones finish (admin)."""
        return Call(model(PoolOut), path={"pool_id": pool_id, "replica_id": replica_id})

    @route("POST", "/v1/pools/{pool_id}/replicas/{replica_id}/undrain")
    def undrain_replica(pool_id: str, replica_id: str) -> Call[PoolOut]:
        return Call(model(PoolOut), path={"pool_id": pool_id, "replica_id": replica_id})

    # --- streams

    @stream_route("/v1/steps/{step_id}/stream", ends_on=TERMINAL)
    def stream_step(
        step_id: str, *, last_event_id: str | int | None = None, give_up_s: float | None = None
    ) -> Start:
        """The step's events (``started``, ``token``..., ``end`` or ``error``), resumed
        after a drop; from ``last_event_id`` when given."""
        return Start({"step_id": step_id}, last_event_id, give_up_s)

    @stream_route("/v1/runs/{run_id}/stream", ends_on=frozenset({"run_end"}))
    def stream_run(
        run_id: str, *, last_event_id: str | int | None = None, give_up_s: float | None = None
    ) -> Start:
        """Every event of the run's steps and facts in commit order, to ``run_end``."""
        return Start({"run_id": run_id}, last_event_id, give_up_s)
