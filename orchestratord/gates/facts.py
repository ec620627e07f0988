"""What a gate reads: the run and its latest facts, as the JSON an evaluation is sent, and
a fingerprint of them that changes when a fact is appended or a step settles.

The facts a gate sees are the latest that fit ``max_input_bytes`` of JSON (and at most
``MAX_FACTS``). Their sizes are read first, as the database writes their text, so a run
holding many large facts is never read whole into the server's memory: only the window is,
in chunks of at most ``CHUNK_ROWS`` rows or ``CHUNK_BYTES`` (SQLite reads run on the event
loop: each chunk holds it a few milliseconds, and others' requests go between chunks).
A fact's data is read as the text the database holds and sent on as it is, never decoded
here: the evaluating process decodes it.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from orchestrator_core import clock
from orchestrator_core.gates import MAX_FACTS
from orchestratord.db import json_codec
from orchestratord.db.engine import Database
from orchestratord.db.models import Fact, Run
from orchestratord.runs.ledger import usage_of

_ENVELOPE = 300  # a fact's JSON besides its data: type (<= 200), step id, time, keys
CHUNK_ROWS = 500
CHUNK_BYTES = 1 << 20

_SIZES = (
    sa.select(Fact.id, sa.func.length(sa.cast(Fact.data, sa.Text)))
    .where(Fact.run_id == sa.bindparam("run_id"))
    .order_by(Fact.id.desc())
    .limit(MAX_FACTS)
)
_ROWS = (
    sa.select(Fact.type, sa.cast(Fact.data, sa.Text), Fact.emitted_by_step, Fact.created_at)
    .where(
        Fact.run_id == sa.bindparam("run_id"),
        Fact.id.between(sa.bindparam("first"), sa.bindparam("last")),
    )
    .order_by(Fact.id)
)
_OF_RUN = Fact.run_id == sa.bindparam("run_id")
_FINGERPRINT = sa.select(
    sa.select(sa.func.count(Fact.id)).where(_OF_RUN).scalar_subquery(),
    sa.select(sa.func.max(Fact.id)).where(_OF_RUN).scalar_subquery(),
    Run.tokens_in_used,
    Run.tokens_out_used,
    Run.cost_used_usd,
    Run.unpriced_steps,
    Run.budgets,
).where(Run.run_id == sa.bindparam("run_id"))


@dataclass(frozen=True)
class Variables:
    """The variables of an evaluation as JSON, less its expression: ``"run":..,"facts":[..]}``
    (``request`` puts the expression in front)."""

    body: bytes
    input_bytes: int  # of ``run`` and ``facts``
    facts: int
    read_s: float  # how long reading them took, on the event loop mostly

    def request(self, expr: str) -> bytes:
        return b"".join([b'{"expr":', _json(expr), b",", self.body])


class SharedReads:
    """Gates of one run woken by one fact read its facts once: a read of a run's variables
    at a fingerprint is shared by every gate that asks for it while it is under way. Nothing
    is kept after: a window may be megabytes, and a waiting gate holds none of it."""

    def __init__(self) -> None:
        self._reading: dict[tuple[str, Any, int], asyncio.Task[Variables]] = {}
        self.reads = 0  # counted by tests

    async def variables(
        self, db: Database, run_id: str, fingerprint: Any, *, max_input_bytes: int
    ) -> Variables:
        """The run's variables; a gate cancelled while they are read leaves the read to the
        others waiting on it."""
        key = (run_id, fingerprint, max_input_bytes)
        task = self._reading.get(key)
        if task is None:
            self.reads += 1
            task = asyncio.ensure_future(
                read_variables(db, run_id, max_input_bytes=max_input_bytes)
            )
            self._reading[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        return await asyncio.shield(task)

    def _done(self, key: tuple[str, Any, int], task: asyncio.Task[Variables]) -> None:
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here: every gate that asked may have gone


async def read_variables(db: Database, run_id: str, *, max_input_bytes: int) -> Variables:
    started = clock.monotonic()
    async with db.read() as session:
        run = (await session.execute(sa.select(Run).where(Run.run_id == run_id))).scalar_one()
        view = {"run_id": run.run_id, "usage": usage_of(run), "budgets": run.budgets}
    head = _json(view)
    facts: list[bytes] = []
    for first, last in _chunks(await _window(db, run_id, max_input_bytes - len(head))):
        async with db.read() as session:
            params = {"run_id": run_id, "first": first, "last": last}
            facts.extend(_fact(*row) for row in (await session.execute(_ROWS, params)).all())
        await asyncio.sleep(0)  # the loop serves others between chunks
    total, keep = len(head), 0
    for part in reversed(facts):  # the text's size is near its JSON's, not always equal
        if total + len(part) + 1 > max_input_bytes:
            break
        total += len(part) + 1
        keep += 1
    kept = facts[len(facts) - keep :]
    body = b"".join([b'"run":', head, b',"facts":[', b",".join(kept), b"]}"])
    return Variables(body, total, keep, clock.monotonic() - started)


async def read_fingerprint(db: Database, run_id: str) -> tuple[Any, ...]:
    """Changes when a fact is appended to the run, or one of its steps settles (its usage)."""
    async with db.read() as session:
        *counts, budgets = (await session.execute(_FINGERPRINT, {"run_id": run_id})).one()
    return (*counts, _json(budgets))  # hashable: reads are shared by fingerprint


async def _window(db: Database, run_id: str, budget: int) -> list[tuple[int, int]]:
    """The ids and sizes of the latest facts that fit ``budget`` bytes, oldest first."""
    async with db.read() as session:
        sizes = (await session.execute(_SIZES, {"run_id": run_id})).all()
    await asyncio.sleep(0)
    total, kept = 0, []
    for fact_id, length in sizes:
        size = (length or 0) + _ENVELOPE
        if total + size > budget:
            break
        total += size
        kept.append((fact_id, size))
    return kept[::-1]


def _chunks(window: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(first id, last id) of runs of at most ``CHUNK_ROWS`` rows or ``CHUNK_BYTES``."""
    out: list[tuple[int, int]] = []
    start, rows, size = 0, 0, 0
    for i, (_, length) in enumerate(window):
        if rows and (rows == CHUNK_ROWS or size + length > CHUNK_BYTES):
            out.append((window[start][0], window[i - 1][0]))
            start, rows, size = i, 0, 0
        rows += 1
        size += length
    if rows:
        out.append((window[start][0], window[-1][0]))
    return out


def _fact(kind: str, data: str | None, step_id: str | None, created: Any) -> bytes:
    """A fact's JSON, its data the database's own text (``ts`` as ``isoformat`` writes it)."""
    envelope = orjson.dumps({"type": kind, "step_id": step_id, "ts": created})
    body = data.encode() if data is not None else b"null"
    return b"".join([envelope[:-1], b',"data":', body, b"}"])


def _json(value: Any) -> bytes:
    return json_codec.dumps(value).encode()
