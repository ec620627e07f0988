"""Export a finished run as a bundle (``contracts/transfer.py``) and import it elsewhere.

Rows are read and written column by column from the tables themselves, so a column added to
a model travels without a change here. An import keeps every id, checks the whole bundle
before it writes anything, and writes it in the caller's one transaction; the events keep
their run cursors and seqs, and their ``data`` unchanged. The checks are of two kinds: each
row's shape and references (here), and the record's agreement with itself, so that a forged
token, output, hash or id is refused (``transfer_checks``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Budgets
from contracts.flows import FlowCreate
from contracts.transfer import BUNDLE_FORMAT, RunBundle
from orchestrator_core.admission import PRIORITY_RANK
from orchestrator_core.errors import Conflict, InvalidParams, NotFound
from orchestrator_core.event_order import EventOrder, EventOrderError, EventType
from orchestrator_core.flows import flow_id_for, normalize_flow
from orchestrator_core.lifecycle import RunStatus, StepStatus
from orchestratord.db.models import Checkpoint, Event, Fact, Flow, Run, Step
from orchestratord.eventlog import EVENT_COLUMNS as _EVENT_COLUMNS
from orchestratord.eventlog import expand
from orchestratord.runs.transfer_checks import check_record
from orchestratord.steps.kinds import KINDS
from orchestratord.tx import Tx

Row = dict[str, Any]

_FLOWS = cast(sa.Table, Flow.__table__)
_RUNS = cast(sa.Table, Run.__table__)
_STEPS = cast(sa.Table, Step.__table__)
_EVENTS = cast(sa.Table, Event.__table__)
_FACTS = cast(sa.Table, Fact.__table__)
_CHECKPOINTS = cast(sa.Table, Checkpoint.__table__)

# The tables a run owns, in bundle order, and the order their rows are listed in.
_OWNED: tuple[tuple[sa.Table, str], ...] = (
    (_STEPS, "position"),
    (_EVENTS, "run_seq"),
    (_FACTS, "id"),
    (_CHECKPOINTS, "checkpoint_id"),
)
_OPEN_STEP = (StepStatus.QUEUED.value, StepStatus.RUNNING.value)
_ENDED_STEP = frozenset(s.value for s in StepStatus if s.terminal)
_INT_BITS = ((sa.BigInteger, 63), (sa.SmallInteger, 15), (sa.Integer, 31))


# --- rows <-> JSON, generically from the columns ------------------------------------------


def _columns(table: sa.Table) -> list[sa.Column[Any]]:
    """The columns that travel: all but an autoincrement surrogate key and storage detail."""
    return [
        c
        for c in table.columns
        if c is not table.autoincrement_column and c.info.get("bundle", True)
    ]


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _json_value(value: Any) -> Any:
    return _rfc3339(value) if isinstance(value, datetime) else value


def _encode(table: sa.Table, row: Mapping[Any, Any]) -> Row:
    return {str(c.name): _json_value(row[c.name]) for c in _columns(table)}


def _base_type(column: sa.Column[Any]) -> sa.types.TypeEngine[Any]:
    ctype: sa.types.TypeEngine[Any] = column.type
    while isinstance(ctype, sa.TypeDecorator):
        ctype = ctype.impl_instance
    return ctype


def _decode_value(column: sa.Column[Any], value: Any, path: str) -> Any:
    if value is None:
        if not column.nullable:
            raise InvalidParams("must not be null", field=path)
        return None
    ctype = _base_type(column)
    if isinstance(ctype, sa.JSON):
        return value
    if isinstance(ctype, sa.DateTime):
        return _parse_time(value, path)
    if isinstance(ctype, sa.Boolean):
        if not isinstance(value, bool):
            raise InvalidParams("must be a boolean", field=path)
        return value
    if isinstance(ctype, sa.Integer):
        bits = next(b for t, b in _INT_BITS if isinstance(ctype, t))
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidParams("must be an integer", field=path)
        if not -(2**bits) <= value < 2**bits:
            raise InvalidParams(f"must fit in {bits + 1} bits", field=path)
        return value
    if isinstance(ctype, sa.Float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise InvalidParams("must be a number", field=path)
        return float(value)
    if isinstance(ctype, sa.String):
        if not isinstance(value, str):
            raise InvalidParams("must be a string", field=path)
        if ctype.length is not None and len(value) > ctype.length:
            raise InvalidParams(f"must be at most {ctype.length} characters", field=path)
        if "\x00" in value:
            raise InvalidParams("must not contain NUL characters", field=path)
        return value
    return value


def _parse_time(value: Any, path: str) -> datetime:
    if not isinstance(value, str):
        raise InvalidParams("must be an RFC 3339 timestamp string", field=path)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidParams("must be an RFC 3339 timestamp", field=path) from None
    if parsed.tzinfo is None:
        raise InvalidParams("must carry a UTC offset", field=path)
    return parsed.astimezone(UTC)


def _decode(table: sa.Table, raw: Any, path: str) -> Row:
    """A table row from its JSON object: every column, typed; errors name ``path.column``."""
    if not isinstance(raw, dict):
        raise InvalidParams("must be an object of column values", field=path)
    columns = _columns(table)
    known = {c.name for c in columns}
    for key in raw:
        if key not in known:
            raise InvalidParams(f"table {table.name} has no column {key!r}", field=f"{path}.{key}")
    row: Row = {}
    for c in columns:
        if c.name in raw:
            row[c.name] = _decode_value(c, raw[c.name], f"{path}.{c.name}")
        elif c.default is not None and c.default.is_scalar:
            row[c.name] = cast(Any, c.default).arg
        elif c.nullable:
            row[c.name] = None
        else:
            raise InvalidParams("is required", field=f"{path}.{c.name}")
    return row


# --- export --------------------------------------------------------------------------------


async def _select(session: AsyncSession, table: sa.Table, where: Any, order: str) -> list[Row]:
    stmt = sa.select(*table.columns).where(where).order_by(table.c[order])
    return [_encode(table, r) for r in (await session.execute(stmt)).mappings()]


async def _event_rows(session: AsyncSession, run_id: str) -> list[Row]:
    """The run's events, one row per event (the log may store several in one row)."""
    stmt = sa.select(*_EVENT_COLUMNS).where(Event.run_id == run_id).order_by(Event.run_seq)
    return [
        {
            "run_id": ev.run_id,
            "run_seq": ev.run_seq,
            "step_id": ev.step_id,
            "seq": ev.seq,
            "type": ev.type,
            "data": ev.data.decode(),
        }
        for ev in expand((await session.execute(stmt)).all())
    ]


async def _owned_rows(session: AsyncSession, run_id: str) -> dict[str, Any]:
    """The run's row and the rows it owns, encoded as a bundle carries them."""
    body: dict[str, Any] = {}
    runs = await _select(session, _RUNS, _RUNS.c.run_id == run_id, "run_id")
    if not runs:
        raise NotFound("run", run_id)
    body["run"] = runs[0]
    for table, order in _OWNED:
        if table is _EVENTS:
            body["events"] = await _event_rows(session, run_id)
            continue
        body[str(table.name)] = await _select(session, table, table.c.run_id == run_id, order)
    return body


async def export_run(session: AsyncSession, run_id: str) -> dict[str, Any]:
    """The bundle of a run whose steps have all ended (409 naming those that have not)."""
    if session.get_bind().dialect.name == "postgresql" and not session.in_transaction():
        # One snapshot for every table: facts appended meanwhile cannot half appear.
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    body = await _owned_rows(session, run_id)
    open_steps = [s["step_id"] for s in body["steps"] if s["status"] in _OPEN_STEP]
    if open_steps:
        raise Conflict(
            f"the run has {len(open_steps)} step(s) that have not ended; "
            "a bundle is a finished record",
            details={"run_id": run_id, "steps": open_steps},
        )
    flows = await _select(session, _FLOWS, _FLOWS.c.flow_id == body["run"]["flow_id"], "flow_id")
    return {"format": BUNDLE_FORMAT, "flow": flows[0], **body}


# --- validation ----------------------------------------------------------------------------


@dataclass
class _Decoded:
    flow: Row
    run: Row
    steps: list[Row]
    events: list[Row]
    facts: list[Row]
    checkpoints: list[Row]

    def owned(self) -> dict[str, Any]:
        """Encoded as an export of the stored run would be, to compare with one."""
        return {
            "run": _encode(_RUNS, self.run),
            "steps": [_encode(_STEPS, r) for r in self.steps],
            "events": [_encode(_EVENTS, r) for r in self.events],
            "facts": [_encode(_FACTS, r) for r in self.facts],
            "checkpoints": [_encode(_CHECKPOINTS, r) for r in self.checkpoints],
        }


def _parse(bundle: RunBundle | Mapping[str, Any]) -> RunBundle:
    if isinstance(bundle, RunBundle):
        return bundle
    try:
        return RunBundle.model_validate(bundle)
    except ValidationError as exc:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"]) or "body", "message": e["msg"]}
            for e in exc.errors()
        ]
        raise InvalidParams(
            errors[0]["message"], field=errors[0]["field"], details={"errors": errors}
        ) from None


def _check_flow(flow: Row) -> None:
    """The flow's id and hash must be those of its content."""
    try:
        body = FlowCreate.model_validate({k: flow[k] for k in ("ast", "tools", "config", "labels")})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(["flow", *(str(p) for p in first["loc"])])
        raise InvalidParams(first["msg"], field=field) from None
    try:
        content = normalize_flow(
            ast=body.ast, tools=[t.model_dump(mode="json") for t in body.tools], config=body.config
        )
    except InvalidParams as exc:
        raise InvalidParams(exc.details["errors"][0]["message"], field=f"flow.{exc.field}") from exc
    if content.hash != flow["hash"]:
        raise InvalidParams(
            f"is not the hash of the flow's content ({content.hash})", field="flow.hash"
        )
    if flow_id_for(content.hash) != flow["flow_id"]:
        raise InvalidParams("is not the id of the flow's content", field="flow.flow_id")


def _check_budgets(value: Any, field: str) -> None:
    """Budgets past the API's bounds are refused here too: a run holding them takes no step."""
    try:
        Budgets.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidParams(
            first["msg"], field=".".join([field, *(str(p) for p in first["loc"])])
        ) from None


def _check_owner(rows: Sequence[Row], name: str, run_id: str) -> None:
    for i, row in enumerate(rows):
        if row["run_id"] != run_id:
            raise InvalidParams(
                f"belongs to run {row['run_id']!r}, not to the bundle's run {run_id!r}",
                field=f"{name}[{i}].run_id",
            )


def _check_step_refs(rows: Sequence[Row], name: str, column: str, steps: set[str]) -> None:
    for i, row in enumerate(rows):
        if row[column] is not None and row[column] not in steps:
            raise InvalidParams("no step with this id in the bundle", field=f"{name}[{i}].{column}")


def _unique_keys(table: sa.Table) -> list[tuple[str, ...]]:
    names = {c.name for c in _columns(table)}
    keys: list[tuple[str, ...]] = []
    for constraint in table.constraints:
        if isinstance(constraint, sa.PrimaryKeyConstraint | sa.UniqueConstraint):
            key = tuple(c.name for c in constraint.columns)
            if key and set(key) <= names and key not in keys:
                keys.append(key)
    for c in _columns(table):
        if c.unique and (c.name,) not in keys:
            keys.append((c.name,))
    return keys


def _check_unique(table: sa.Table, rows: Sequence[Row]) -> None:
    for key in _unique_keys(table):
        seen: dict[tuple[Any, ...], int] = {}
        for i, row in enumerate(rows):
            values = tuple(row[k] for k in key)
            if None in values:  # NULLs are distinct in SQL unique constraints
                continue
            if values in seen:
                raise InvalidParams(
                    f"repeats {table.name}[{seen[values]}] ({', '.join(key)})",
                    field=f"{table.name}[{i}].{key[-1]}",
                )
            seen[values] = i


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and bool(a == b)


def _check_event(row: Row, path: str) -> None:
    if row["step_id"] is None and row["seq"] is not None:
        raise InvalidParams(
            "must be null for an event of the run (no step_id)", field=f"{path}.seq"
        )
    if row["step_id"] is not None and row["seq"] is None:
        raise InvalidParams("must be set for an event of a step", field=f"{path}.seq")
    if row["run_seq"] < 0:
        raise InvalidParams("must be >= 0", field=f"{path}.run_seq")
    try:
        data = orjson.loads(row["data"])
    except orjson.JSONDecodeError:
        raise InvalidParams("is not JSON text", field=f"{path}.data") from None
    if not isinstance(data, dict):
        raise InvalidParams("is not a JSON object", field=f"{path}.data")
    for key in ("step_id", "seq", "type"):
        if key not in data or not _same(data[key], row[key]):
            raise InvalidParams(
                f"its {key} ({data.get(key)!r}) differs from the row's ({row[key]!r})",
                field=f"{path}.data",
            )


def _check_step_logs(steps: Sequence[Row], events: Sequence[Row]) -> None:
    """Per step: seqs 0..n-1 without a gap, in the event grammar, ending with end or error."""
    by_step: dict[str, list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        if ev["step_id"] is not None:
            by_step[ev["step_id"]].append(i)
    for s, step in enumerate(steps):
        indexes = sorted(by_step.get(step["step_id"], []), key=lambda i: events[i]["seq"])
        if not indexes:
            raise InvalidParams(
                "the step has no events; an ended step has a log", field=f"steps[{s}]"
            )
        order = EventOrder()
        for expected, i in enumerate(indexes):
            ev = events[i]
            if ev["seq"] != expected:
                raise InvalidParams(
                    f"seq {ev['seq']} of step {step['step_id']} leaves a gap or repeats: "
                    f"expected {expected}",
                    field=f"events[{i}].seq",
                )
            try:
                order.accept(EventType(ev["type"]))
            except ValueError:
                raise InvalidParams(
                    f"unknown event type {ev['type']!r}", field=f"events[{i}].type"
                ) from None
            except EventOrderError as exc:
                raise InvalidParams(str(exc), field=f"events[{i}].type") from None
        if not order.closed:
            raise InvalidParams(
                f"the last event of step {step['step_id']} must be end or error",
                field=f"events[{indexes[-1]}].type",
            )


def _check_choice(value: Any, allowed: Sequence[str], field: str) -> None:
    if value not in allowed:
        raise InvalidParams(f"is {value!r}; one of {', '.join(allowed)}", field=field)


def _validate(bundle: RunBundle) -> _Decoded:
    flow = _decode(_FLOWS, bundle.flow, "flow")
    _check_flow(flow)
    run = _decode(_RUNS, bundle.run, "run")
    _check_budgets(run["budgets"], "run.budgets")
    if run["flow_id"] != flow["flow_id"]:
        raise InvalidParams("is not the bundle's flow", field="run.flow_id")
    _check_choice(run["mode"], ("record", "replay", "strict_replay"), "run.mode")
    _check_choice(run["status"], tuple(s.value for s in RunStatus), "run.status")
    run_id = run["run_id"]
    rows = {
        name: [_decode(table, r, f"{name}[{i}]") for i, r in enumerate(raw)]
        for name, table, raw in (
            ("steps", _STEPS, bundle.steps),
            ("events", _EVENTS, bundle.events),
            ("facts", _FACTS, bundle.facts),
            ("checkpoints", _CHECKPOINTS, bundle.checkpoints),
        )
    }
    for name, table_rows in rows.items():
        _check_owner(table_rows, name, run_id)
    for table, _ in _OWNED:
        _check_unique(table, rows[table.name])
    steps, events = rows["steps"], rows["events"]
    for i, step in enumerate(steps):
        if step["status"] not in _ENDED_STEP:
            raise InvalidParams(
                f"is {step['status']!r}: a bundle holds ended steps only "
                "(succeeded, failed or cancelled)",
                field=f"steps[{i}].status",
            )
        _check_choice(step["type"], tuple(KINDS), f"steps[{i}].type")  # the kinds served
        _check_choice(step["priority"], tuple(PRIORITY_RANK), f"steps[{i}].priority")
        if step["priority_rank"] != PRIORITY_RANK[step["priority"]]:
            raise InvalidParams(
                f"must be {PRIORITY_RANK[step['priority']]} for priority {step['priority']!r}",
                field=f"steps[{i}].priority_rank",
            )
        if not 0 <= step["position"] < run["step_count"]:
            raise InvalidParams(
                f"must be within 0..{run['step_count'] - 1} (run.step_count)",
                field=f"steps[{i}].position",
            )
    step_ids = {s["step_id"] for s in steps}
    _check_step_refs(events, "events", "step_id", step_ids)
    _check_step_refs(rows["facts"], "facts", "emitted_by_step", step_ids)
    _check_step_refs(rows["checkpoints"], "checkpoints", "step_id", step_ids)
    for i, ev in enumerate(events):
        _check_event(ev, f"events[{i}]")
    _check_step_logs(steps, events)
    check_record(
        run=run, steps=steps, events=events, facts=rows["facts"], checkpoints=rows["checkpoints"]
    )
    # The next run cursor follows the imported ones.
    run["event_seq"] = max((ev["run_seq"] for ev in events), default=-1) + 1
    return _Decoded(flow, run, steps, events, rows["facts"], rows["checkpoints"])


# --- import --------------------------------------------------------------------------------


async def _taken_ids(session: AsyncSession, decoded: _Decoded) -> dict[str, list[str]]:
    """Ids of the bundle already used by other runs' rows."""
    taken: dict[str, list[str]] = {}
    for name, column, rows in (
        ("steps", _STEPS.c.step_id, decoded.steps),
        ("facts", _FACTS.c.fact_id, decoded.facts),
        ("checkpoints", _CHECKPOINTS.c.checkpoint_id, decoded.checkpoints),
    ):
        ids = [r[column.name] for r in rows]
        if ids:
            found = (await session.execute(sa.select(column).where(column.in_(ids)))).scalars()
            if used := sorted(found):
                taken[name] = used
    return taken


async def _flow_to_insert(session: AsyncSession, flow: Row) -> bool:
    """Whether the flow must be inserted; a stored flow with that id must have its hash."""
    stored = (
        await session.execute(sa.select(_FLOWS.c.hash).where(_FLOWS.c.flow_id == flow["flow_id"]))
    ).scalar_one_or_none()
    if stored is None:
        return True
    if stored != flow["hash"]:
        raise Conflict(
            f"flow {flow['flow_id']} is stored with another hash",
            details={"flow_id": flow["flow_id"], "hash": stored, "bundle_hash": flow["hash"]},
        )
    return False


async def import_run(tx: Tx, bundle: RunBundle | Mapping[str, Any]) -> tuple[Run, bool]:
    """Store a bundle's run with its ids; returns (run, created).

    The same bundle again answers the stored run (created=False); another bundle of a stored
    run is a ``Conflict``. Everything is checked before anything is written.
    """
    session = tx.session
    decoded = _validate(_parse(bundle))
    run_id = decoded.run["run_id"]
    if await session.get(Run, run_id) is not None:
        if await _owned_rows(session, run_id) != decoded.owned():
            raise Conflict(
                f"run {run_id} exists with a different record", details={"run_id": run_id}
            )
        return await _load_run(session, run_id), False
    insert_flow = await _flow_to_insert(session, decoded.flow)
    if taken := await _taken_ids(session, decoded):
        raise Conflict("ids of the bundle are used by other runs", details={"taken": taken})
    try:
        if insert_flow:
            await session.execute(sa.insert(_FLOWS), [decoded.flow])
        await session.execute(sa.insert(_RUNS), [decoded.run])
        for table, rows in (
            (_STEPS, decoded.steps),
            (_EVENTS, decoded.events),
            (_FACTS, decoded.facts),
            (_CHECKPOINTS, decoded.checkpoints),
        ):
            if rows:
                await session.execute(sa.insert(table), rows)
    except IntegrityError as exc:  # another import of the same ids committed meanwhile
        raise Conflict(f"run {run_id} was written concurrently; retry", retriable=True) from exc
    return await _load_run(session, run_id), True


async def _load_run(session: AsyncSession, run_id: str) -> Run:
    stmt = sa.select(Run).where(Run.run_id == run_id).execution_options(populate_existing=True)
    return (await session.execute(stmt)).scalar_one()
