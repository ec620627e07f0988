"""Whether a bundle's record agrees with itself: what an import checks beyond the rows' shapes.

A bundle is the only evidence of what its run did, so a changed token, output, hash or id
must not pass for a record. Everything that the service derives from something else in the
record is derived again here and compared:

- every event's payload has its type's shape (``contracts.events``); token events are
  numbered ``i`` = 0, 1, ... in seq order, and each step's seq order is its run_seq order;
- a step's ``output.text`` is the concatenation of its token texts and ``output.token_ids``
  their ids; ``tokens_out`` (step, end event, provenance) is the number of token events;
- ``prompt_hash`` and ``params_hash`` (in ``started``, in the terminal event's provenance and
  in the step's provenance) are the hashes of the step's stored input; in a ``record`` run,
  ``seed`` and ``policy_hash`` are the run's, and the run's ``policy_hash`` is its policy's;
- the terminal event agrees with the step's row: status, stop reason, token counts, error
  body and provenance;
- ``fact`` and ``checkpoint`` events are the bundle's fact and checkpoint rows; a checkpoint's
  ``state_hash`` is its state's; ``run_end`` names the run and its status;
- the run holds exactly ``step_count`` steps, and its usage is the sum of theirs;
- what a kind makes of its events is its kind's to check (``StepKind.check_record``, in the
  kind's module): a plan's ``output.suggestions`` are its ``tool_suggest`` events, a tool
  call's ``output.result`` its ``tool_result`` fact's, a checkpoint's output its event's.

A refusal is ``InvalidParams`` naming the field (``events[12].data.t``), with ``step_id`` and
``seq`` in its details when an event or a step is at fault.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import orjson
from pydantic import ValidationError

from contracts.events import STEP_EVENTS, EventBase
from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import InvalidParams, OrchestratorError, Unsupported
from orchestrator_core.policy import RulePolicy
from orchestrator_core.replay import StepKey
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.kinds.record import RecordedEvent, StepRecord
from orchestratord.steps.kinds.record import refuse as _refuse

Row = dict[str, Any]

_MODELS: dict[str, type[EventBase]] = {m.event_type: m for m in STEP_EVENTS}
# the error body's fields that the step's row and its error event both carry
_ERROR_FIELDS = ("code", "message", "retriable", "retry_after_ms", "details")
_COST_TOLERANCE = 1e-6


def check_record(
    *,
    run: Row,
    steps: Sequence[Row],
    events: Sequence[Row],
    facts: Sequence[Row],
    checkpoints: Sequence[Row],
) -> None:
    """Refuse a bundle whose record disagrees with itself (see the module's docstring).

    Its rows have been decoded, and its step logs checked for gaps and grammar."""
    parsed = [_parse(i, ev) for i, ev in enumerate(events)]
    facts_by_id = {f["fact_id"]: (i, f) for i, f in enumerate(facts)}
    checkpoints_by_id = {c["checkpoint_id"]: (i, c) for i, c in enumerate(checkpoints)}
    records = [
        StepRecord(i, row, run, facts=facts_by_id, checkpoints=checkpoints_by_id)
        for i, row in enumerate(steps)
    ]
    by_id = {r.step_id: r for r in records}
    run_events: list[RecordedEvent] = []
    for ev in parsed:
        if ev.data.get("step_id") is None:
            run_events.append(ev)
        else:
            by_id[ev.data["step_id"]].events.append(ev)
    _check_run(run, steps)
    for i, checkpoint in enumerate(checkpoints):
        _check_state_hash(checkpoint, f"checkpoints[{i}]")
    for record in records:
        record.events.sort(key=lambda ev: ev.seq or 0)
        _StepCheck(record).check()
    for ev in run_events:
        _check_run_event(run, ev, facts_by_id)
    _check_usage(run, steps)


# --- events ----------------------------------------------------------------------------


def _parse(index: int, row: Row) -> RecordedEvent:
    data = orjson.loads(row["data"])  # a JSON object: checked with the rows
    ev = RecordedEvent(index, row["seq"], row["run_seq"], row["type"], data)
    model = _MODELS.get(ev.type)
    if model is None:
        _refuse(f"unknown event type {ev.type!r}", field=f"{ev.path}.type")
    try:
        model.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        _refuse(
            f"is not a valid {ev.type} event: {first['msg']}",
            field=f"{ev.path}.data{'.' + where if where else ''}",
            step_id=row["step_id"],
            seq=row["seq"],
        )
    return ev


def _check_run_event(run: Row, ev: RecordedEvent, facts: Mapping[str, tuple[int, Row]]) -> None:
    if ev.type == "run_end":
        for key in ("run_id", "status"):
            if ev.data[key] != run[key]:
                _refuse(
                    f"run_end names {key} {ev.data[key]!r}, the run's is {run[key]!r}",
                    field=f"{ev.path}.data.{key}",
                )
    elif ev.type == "fact":
        _check_fact_event(ev, facts, step=None, required=True)
    else:
        _refuse(f"a {ev.type} event must belong to a step", field=f"{ev.path}.step_id")


def _check_fact_event(
    ev: RecordedEvent,
    facts: Mapping[str, tuple[int, Row]],
    *,
    step: StepRecord | None,
    required: bool,
) -> None:
    step_id = None if step is None else step.step_id
    found = facts.get(ev.data["fact_id"])
    if found is None:
        if required:
            _refuse(
                f"no fact {ev.data['fact_id']!r} in the bundle's facts",
                field=f"{ev.path}.data.fact_id",
                step_id=step_id,
                seq=ev.seq,
            )
        return
    i, fact = found
    pairs = (
        ("fact_type", "type"),
        ("data", "data"),
        ("schema_uri", "schema_uri"),
        ("emitted_by_step", "emitted_by_step"),
    )
    for key, column in pairs:
        if ev.data.get(key) != fact[column]:
            _refuse(
                f"the fact event's {key} differs from facts[{i}].{column}",
                field=f"{ev.path}.data.{key}",
                step_id=step_id,
                seq=ev.seq,
            )


# --- the run -----------------------------------------------------------------------------


def _check_run(run: Row, steps: Sequence[Row]) -> None:
    if run["step_count"] != len(steps):
        _refuse(
            f"is {run['step_count']} but the bundle holds {len(steps)} steps",
            field="run.step_count",
        )
    if run["policy_hash"]:  # empty: a run stored before policies were hashed
        try:
            expected = RulePolicy.from_policy(run["policy"], field="run.policy").policy_hash
        except InvalidParams as exc:
            _refuse(exc.details["errors"][0]["message"], field=exc.field)
        if run["policy_hash"] != expected:
            _refuse(f"is not the hash of run.policy ({expected})", field="run.policy_hash")


def _check_usage(run: Row, steps: Sequence[Row]) -> None:
    """The run's usage is what its steps used (checked last: a step's own count is the
    more precise culprit)."""
    for used, column in (("tokens_in_used", "tokens_in"), ("tokens_out_used", "tokens_out")):
        total = sum(s[column] for s in steps)
        if run[used] != total:
            _refuse(
                f"is {run[used]} but the steps' {column} add up to {total}", field=f"run.{used}"
            )
    # a step of a model without a price has cost null: the run's cost_used_usd is the sum over
    # the priced ones (what a cost budget counts) and unpriced_steps counts the others
    costs = [s.get("cost_usd") for s in steps]
    priced = [c for c in costs if isinstance(c, int | float) and not isinstance(c, bool)]
    total_cost = math.fsum(priced)
    used_cost = run.get("cost_used_usd")
    if used_cost is not None and abs(used_cost - total_cost) > _COST_TOLERANCE * max(
        1.0, total_cost
    ):
        _refuse(
            f"is {used_cost} but the priced steps' cost_usd add up to {total_cost}",
            field="run.cost_used_usd",
        )
    unpriced = sum(1 for c in costs if c is None)
    if "unpriced_steps" in run and run["unpriced_steps"] != unpriced:
        _refuse(
            f"is {run['unpriced_steps']} but {unpriced} steps have cost_usd null",
            field="run.unpriced_steps",
        )


def _check_state_hash(checkpoint: Row, path: str) -> None:
    try:
        expected = sha256_of(checkpoint["state"])
    except InvalidParams as exc:
        _refuse(exc.details["errors"][0]["message"], field=f"{path}.state")
    if checkpoint["state_hash"] != expected:
        _refuse(f"is not the hash of {path}.state ({expected})", field=f"{path}.state_hash")


# --- one step ----------------------------------------------------------------------------


class _StepCheck:
    """What every step's record must agree with; its kind then checks its own output
    (``StepKind.check_record``)."""

    def __init__(self, record: StepRecord) -> None:
        self.run = record.run
        self.record = record
        self.step = record.row
        self.tokens = record.of_type("token")
        self.recorded_here = record.recorded_here

    def check(self) -> None:
        self._order()
        self._tokens()
        self._output()
        self._hashes()
        self._terminal()
        self._body_events()
        kind_of(self.step["type"]).check_record(self.record)

    def refuse(self, message: str, *, field: str, ev: RecordedEvent | None = None) -> NoReturn:
        self.record.refuse(message, field=field, ev=ev)

    def _order(self) -> None:
        """The step's stream (by seq) and the run's (by run_seq) tell one order."""
        last: RecordedEvent | None = None
        for ev in self.record.events:
            if last is not None and ev.run_seq < last.run_seq:
                self.refuse(
                    f"run_seq {ev.run_seq} comes before the run_seq {last.run_seq} of the "
                    f"step's event seq {last.seq}: the step's events are out of order",
                    field=f"{ev.path}.run_seq",
                    ev=ev,
                )
            last = ev

    def _tokens(self) -> None:
        for n, ev in enumerate(self.tokens):
            if ev.data["i"] != n:
                self.refuse(
                    f"token index i is {ev.data['i']}, expected {n} (tokens are numbered "
                    "from 0 in seq order)",
                    field=f"{ev.path}.data.i",
                    ev=ev,
                )

    def _output(self) -> None:
        """``output.text`` and ``output.token_ids`` are the token events', in order."""
        step, path, tokens = self.step, self.record.path, self.tokens
        output = step["output"]
        if not isinstance(output, dict) or "text" not in output:
            if tokens:
                self.refuse(
                    f"has no text, but the step streamed {len(tokens)} token events",
                    field=f"{path}.output",
                )
            return
        text = output["text"]
        if not isinstance(text, str):
            self.refuse("must be a string", field=f"{path}.output.text")
        at = 0
        for ev in tokens:
            t = ev.data["t"]
            if text[at : at + len(t)] != t:
                self.refuse(
                    f"token {ev.data['i']} is {t!r} but {path}.output.text has "
                    f"{text[at : at + len(t)]!r} at character {at}",
                    field=f"{ev.path}.data.t",
                    ev=ev,
                )
            at += len(t)
        if at != len(text):
            self.refuse(
                f"is {len(text)} characters long but the step's {len(tokens)} token events "
                f"hold {at}: it is not their concatenation",
                field=f"{path}.output.text",
            )
        if "token_ids" in output:
            ids = output["token_ids"]
            if not isinstance(ids, list) or len(ids) != len(tokens):
                count = len(ids) if isinstance(ids, list) else "not a list"
                self.refuse(
                    f"must list the ids of the step's {len(tokens)} token events ({count})",
                    field=f"{path}.output.token_ids",
                )
            for n, (ev, token_id) in enumerate(zip(tokens, ids, strict=True)):
                if ev.data["token_id"] != token_id:
                    self.refuse(
                        f"token {n} has token_id {ev.data['token_id']!r} but "
                        f"{path}.output.token_ids[{n}] is {token_id!r}",
                        field=f"{ev.path}.data.token_id",
                        ev=ev,
                    )

    def _key(self) -> StepKey:
        step = self.step
        try:
            return kind_of(step["type"]).replay_key(step["input"], self.run["seed"])
        except (Unsupported, KeyError, TypeError, ValueError, AttributeError) as exc:
            self.refuse(
                f"cannot be read as a {step['type']} input ({type(exc).__name__})",
                field=f"{self.record.path}.input",
            )
        except OrchestratorError as exc:
            self.refuse(
                f"cannot be read as a {step['type']} input: {exc.message}",
                field=f"{self.record.path}.input",
            )

    def _hashes(self) -> None:
        """Each place that names the step's determinism inputs names the stored input's."""
        places: list[tuple[dict[str, Any], str, RecordedEvent | None]] = []
        for ev in self.record.of_type("started"):
            places.append((ev.data, f"{ev.path}.data", ev))
        for ev in self.record.of_type("end", "error"):
            if isinstance(ev.data.get("provenance"), dict):
                places.append((ev.data["provenance"], f"{ev.path}.data.provenance", ev))
        if isinstance(self.step["provenance"], dict):
            places.append((self.step["provenance"], f"{self.record.path}.provenance", None))
        named = [p for p in places if p[0].get("prompt_hash") or p[0].get("params_hash")]
        if not named:
            return
        key = self._key()
        expected: dict[str, Any] = {"prompt_hash": key.prompt_hash, "params_hash": key.params_hash}
        if self.recorded_here:
            expected["seed"] = self.run["seed"]
            if self.run["policy_hash"]:
                expected["policy_hash"] = self.run["policy_hash"]
        for values, path, at in named:
            for name, value in expected.items():
                if name in values and values[name] is not None and values[name] != value:
                    source = "the run's" if name in ("seed", "policy_hash") else "the input's"
                    self.refuse(
                        f"{name} is {values[name]!r}, not {source} ({value!r})",
                        field=f"{path}.{name}",
                        ev=at,
                    )

    def _terminal(self) -> None:
        step, path = self.step, self.record.path
        last = self.record.events[-1]  # the log ends with end or error: checked before
        n_tokens = len(self.tokens)
        if step["tokens_out"] != n_tokens:
            self.refuse(
                f"is {step['tokens_out']} but the step streamed {n_tokens} token events",
                field=f"{path}.tokens_out",
            )
        data = last.data
        if last.type == "end":
            cancelled = data["stop_reason"] == "cancelled"
            if (step["status"] == "cancelled") != cancelled or step["status"] == "failed":
                self.refuse(
                    f"is {step['status']!r} but the step's log ends with end "
                    f"(stop_reason {data['stop_reason']!r})",
                    field=f"{path}.status",
                )
            for key in ("tokens_in", "tokens_out"):
                if data[key] != step[key]:
                    self.refuse(
                        f"{key} is {data[key]} but {path}.{key} is {step[key]}",
                        field=f"{last.path}.data.{key}",
                        ev=last,
                    )
            output = step["output"]
            if (
                isinstance(output, dict)
                and "stop_reason" in output
                and output["stop_reason"] != data["stop_reason"]
            ):
                self.refuse(
                    f"is {output['stop_reason']!r} but the end event's is {data['stop_reason']!r}",
                    field=f"{path}.output.stop_reason",
                )
            if step["error"] is not None:
                self.refuse("must be null for a step that ended with end", field=f"{path}.error")
        else:
            if step["status"] != "failed":
                self.refuse(
                    f"is {step['status']!r} but the step's log ends with error",
                    field=f"{path}.status",
                )
            error = step["error"]
            if not isinstance(error, dict):
                self.refuse("must hold the body of the step's error event", field=f"{path}.error")
            for key in _ERROR_FIELDS:
                if error.get(key) != data.get(key):
                    self.refuse(
                        f"{key} differs from the error event's (seq {last.seq})",
                        field=f"{path}.error.{key}",
                        ev=last,
                    )
        provenance = data.get("provenance")
        if isinstance(provenance, dict):
            self._provenance(provenance, last)

    def _provenance(self, provenance: dict[str, Any], last: RecordedEvent) -> None:
        step, path = self.step, self.record.path
        n_tokens = len(self.tokens)
        if provenance["tokens_out"] != n_tokens:
            self.refuse(
                f"tokens_out is {provenance['tokens_out']} but the step streamed "
                f"{n_tokens} token events",
                field=f"{last.path}.data.provenance.tokens_out",
                ev=last,
            )
        if provenance["tokens_in"] != step["tokens_in"]:
            self.refuse(
                f"tokens_in is {provenance['tokens_in']} but {path}.tokens_in is "
                f"{step['tokens_in']}",
                field=f"{last.path}.data.provenance.tokens_in",
                ev=last,
            )
        for key in ("pool_id", "replica_id"):
            if provenance.get(key) is not None and provenance[key] != step[key]:
                self.refuse(
                    f"{key} is {provenance[key]!r} but {path}.{key} is {step[key]!r}",
                    field=f"{last.path}.data.provenance.{key}",
                    ev=last,
                )
        stored = step["provenance"]
        if not isinstance(stored, dict):
            self.refuse(
                f"must be the provenance of the step's {last.type} event (seq {last.seq})",
                field=f"{path}.provenance",
            )
        for key in sorted(provenance.keys() | stored.keys()):
            if provenance.get(key) != stored.get(key):
                self.refuse(
                    f"{key} is {stored.get(key)!r} but the {last.type} event (seq {last.seq}) "
                    f"says {provenance.get(key)!r}",
                    field=f"{path}.provenance.{key}",
                    ev=last,
                )

    def _body_events(self) -> None:
        """``fact`` and ``checkpoint`` events are the bundle's fact and checkpoint rows."""
        record = self.record
        for ev in record.of_type("fact"):
            # a replay run's step serves the recorded events as they were (their facts named
            # the recorded step, and were copied anew)
            if self.recorded_here and ev.data.get("emitted_by_step") != record.step_id:
                self.refuse(
                    "a fact event of a step names the step as emitted_by_step",
                    field=f"{ev.path}.data.emitted_by_step",
                    ev=ev,
                )
            _check_fact_event(ev, record.facts, step=record, required=self.recorded_here)
        for ev in record.of_type("checkpoint"):
            self._checkpoint_event(ev)

    def _checkpoint_event(self, ev: RecordedEvent) -> None:
        record = self.record
        found = record.checkpoints.get(ev.data["checkpoint_id"])
        if found is None:
            if self.recorded_here:
                self.refuse(
                    f"no checkpoint {ev.data['checkpoint_id']!r} in the bundle's checkpoints",
                    field=f"{ev.path}.data.checkpoint_id",
                    ev=ev,
                )
            return
        i, checkpoint = found
        for key, value in (
            ("step_id", record.step_id),
            ("state_hash", ev.data["state_hash"]),
            ("cursors", ev.data["cursors"]),
        ):
            if checkpoint[key] != value:
                self.refuse(
                    f"checkpoints[{i}].{key} differs from the step's checkpoint event",
                    field=f"checkpoints[{i}].{key}",
                    ev=ev,
                )
