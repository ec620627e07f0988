"""Tables of the contract's models, for people (``--json`` prints the models instead).

A list is one row per item with the columns a reader scans; one record is a two-column
table of its fields. Values are shown as text: ``-`` for nothing, JSON for structures,
times to the second in UTC.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from contracts.flows import FlowCreated, FlowOut
from contracts.records import CheckpointOut, FactOut, PoolOut
from contracts.runs import CancelOut, RunOut, Usage
from contracts.steps import StepAccepted, StepOut

Row = tuple[str, Any]


def cell(value: Any) -> str:
    """A value as table text."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping | list):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return str(value)


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:.6f}".rstrip("0").rstrip(".")


def usage_text(usage: Usage) -> str:
    return f"in {usage.tokens_in}, out {usage.tokens_out}, cost {money(usage.cost_usd)}"


def record(rows: Iterable[Row], title: str | None = None) -> Table:
    """A record: one row per field, the name then the value."""
    table = Table(box=None, show_header=False, title=title, title_justify="left", pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in rows:
        table.add_row(name, value if isinstance(value, Text) else cell(value))
    return table


def listing(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> Table:
    """A list: a header, then one row per item. Ids never wrap; the last column folds."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, name in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(name, no_wrap=not last, overflow="fold" if last else "ellipsis")
    count = 0
    for row in rows:
        table.add_row(*(cell(v) for v in row))
        count += 1
    if count == 0:
        table.caption = empty
    return table


# --- flows ----------------------------------------------------------------------------------


def flow_created(flow: FlowCreated) -> Table:
    return record([("flow_id", flow.flow_id), ("hash", flow.hash), ("created", flow.created_at)])


def flow(flow: FlowOut) -> Table:
    tools = [str(t.get("name")) for t in flow.tools]
    return record(
        [
            ("flow_id", flow.flow_id),
            ("hash", flow.hash),
            ("created", flow.created_at),
            ("labels", flow.labels or None),
            ("tools", ", ".join(tools) or None),
            ("config", flow.config or None),
            ("ast", flow.ast),
        ]
    )


# --- runs -----------------------------------------------------------------------------------


def budgets_text(budgets: Mapping[str, Any]) -> str | None:
    set_ = {k.removeprefix("max_"): v for k, v in budgets.items() if v is not None}
    return ", ".join(f"{k} {v}" for k, v in set_.items()) or None


def run(run: RunOut) -> Table:
    return record(
        [
            ("run_id", run.run_id),
            ("flow_id", run.flow_id),
            ("status", run.status),
            ("mode", run.mode),
            ("seed", run.seed),
            ("source_run_id", run.source_run_id),
            ("forked_from", run.forked_from),
            ("steps", run.step_count),
            ("budgets", budgets_text(run.budgets) or "none"),
            ("usage", usage_text(run.usage)),
            ("reserved", usage_text(run.reserved)),
            ("pool_policy", run.pool_policy),
            ("price_table", run.price_table),
            ("created", run.created_at),
            ("ended", run.ended_at),
            ("output", run.output),
        ]
    )


def runs(items: Sequence[RunOut]) -> Table:
    return listing(
        ["RUN", "STATUS", "MODE", "STEPS", "TOKENS IN", "TOKENS OUT", "COST", "CREATED", "FLOW"],
        (
            (
                r.run_id,
                r.status,
                r.mode,
                r.step_count,
                r.usage.tokens_in,
                r.usage.tokens_out,
                money(r.usage.cost_usd),
                r.created_at,
                r.flow_id,
            )
            for r in items
        ),
        empty="no runs",
    )


def cancelled(kind: str, the_id: str, answer: CancelOut) -> Table:
    return record([(kind, the_id), ("status", answer.status)])


# --- steps ----------------------------------------------------------------------------------


def accepted(step: StepAccepted) -> Table:
    return record([("step_id", step.step_id), ("status", step.status)])


def _where(pool_id: str | None, replica_id: str | None) -> str | None:
    if pool_id is None:
        return None
    return f"{pool_id}/{replica_id}" if replica_id else pool_id


def step(step: StepOut) -> Table:
    output = step.output or {}
    error = step.error or {}
    rows: list[Row] = [
        ("step_id", step.step_id),
        ("run_id", step.run_id),
        ("position", step.position),
        ("type", step.type),
        ("status", step.status + (" (cancel requested)" if step.cancel_requested else "")),
        ("pool", _where(step.pool_id, step.replica_id)),
        ("priority", step.priority),
        ("client_token", step.client_token),
        ("input", step.input),
        ("usage", usage_text(step.usage)),
    ]
    if step.max_tokens_granted is not None:
        clamped = " (clamped by the budget)" if step.budget_clamped else ""
        rows.append(("max_tokens", f"{step.max_tokens_granted}{clamped}"))
    if step.placement_decision is not None:
        rows.append(("placement", step.placement_decision.rule))
    if "text" in output:
        rows.append(("text", Text(str(output["text"]))))
        rest = {k: v for k, v in output.items() if k not in ("text", "token_ids")}
        if rest:
            rows.append(("output", rest))
    elif step.output is not None:
        rows.append(("output", step.output))
    if error:
        rows.append(("error", f"{error.get('code')}: {error.get('message')}"))
    if step.replay_of:
        rows.append(("replay_of", f"{step.replay_of} ({step.replay_outcome or '-'})"))
    rows += [("created", step.created_at), ("started", step.started_at), ("ended", step.ended_at)]
    return record(rows)


def steps(items: Sequence[StepOut]) -> Table:
    return listing(
        ["#", "STEP", "TYPE", "STATUS", "POOL", "TOKENS IN", "TOKENS OUT", "CREATED"],
        (
            (
                s.position,
                s.step_id,
                s.type,
                s.status,
                _where(s.pool_id, s.replica_id),
                s.usage.tokens_in,
                s.usage.tokens_out,
                s.created_at,
            )
            for s in items
        ),
        empty="no steps",
    )


# --- facts and checkpoints ------------------------------------------------------------------


def fact(fact: FactOut) -> Table:
    return record(
        [
            ("fact_id", fact.fact_id),
            ("run_id", fact.run_id),
            ("type", fact.type),
            ("schema_uri", fact.schema_uri),
            ("emitted_by", fact.emitted_by_step),
            ("created", fact.created_at),
            ("data", fact.data),
        ]
    )


def facts(items: Sequence[FactOut]) -> Table:
    return listing(
        ["FACT", "TYPE", "RUN", "STEP", "CREATED", "DATA"],
        ((f.fact_id, f.type, f.run_id, f.emitted_by_step, f.created_at, f.data) for f in items),
        empty="no facts",
    )


def checkpoint(cp: CheckpointOut) -> Table:
    return record(
        [
            ("checkpoint_id", cp.checkpoint_id),
            ("run_id", cp.run_id),
            ("step_id", cp.step_id),
            ("state_hash", cp.state_hash),
            ("cursors", cp.cursors),
            ("created", cp.created_at),
            ("state", cp.state),
        ]
    )


def checkpoints(items: Sequence[CheckpointOut]) -> Table:
    return listing(
        ["CHECKPOINT", "STEP", "STATE HASH", "CREATED", "STATE"],
        ((c.checkpoint_id, c.step_id, c.state_hash, c.created_at, c.state) for c in items),
        empty="no checkpoints",
    )


# --- pools ----------------------------------------------------------------------------------


def _models(capabilities: Mapping[str, Any]) -> str | None:
    models = capabilities.get("models")
    if isinstance(models, list) and models:
        return ", ".join(map(str, models))
    model = capabilities.get("model")
    return None if model is None else str(model)


def pools(items: Sequence[PoolOut]) -> Table:
    def ready(pool: PoolOut) -> str:
        up = sum(1 for r in pool.replicas if r.state == "ready")
        return f"{up}/{len(pool.replicas)}"

    return listing(
        ["POOL", "ENGINE", "HEALTH", "READY", "BUSY", "FREE", "QUEUE", "SOURCE", "MODELS", "TAGS"],
        (
            (
                p.pool_id,
                p.engine,
                p.health,
                ready(p),
                p.load.get("slots_busy"),
                p.load.get("slots_free"),
                p.load.get("queue_depth"),
                p.source or "built-in",
                _models(p.capabilities),
                ", ".join(f"{k}={v}" for k, v in sorted(p.tags.items())) or None,
            )
            for p in items
        ),
        empty="no pools",
    )


def replicas(pool: PoolOut) -> Table:
    def health(value: Mapping[str, Any]) -> str:
        word = "ready" if value.get("ready") else "live" if value.get("live") else "down"
        detail = value.get("detail")
        return f"{word} ({detail})" if detail else word

    return listing(
        ["REPLICA", "STATE", "HEALTH", "SLOTS", "BUSY", "FREE", "MODEL", "URL"],
        (
            (
                r.replica_id,
                r.state,
                health(r.health),
                r.slots,
                r.busy,
                r.free,
                r.model or _models(r.capabilities),
                r.url,
            )
            for r in pool.replicas
        ),
        empty="no replicas",
    )


def pool(pool: PoolOut) -> RenderableType:
    head = record(
        [
            ("pool_id", pool.pool_id),
            ("engine", pool.engine),
            ("health", pool.health),
            ("source", pool.source or "built-in"),
            ("tags", pool.tags or None),
            ("models", _models(pool.capabilities)),
            ("features", pool.capabilities.get("features")),
            ("load", pool.load),
            ("price", pool.price),
            ("provision", pool.provision),
        ]
    )
    return Group(head, Text(""), replicas(pool))
