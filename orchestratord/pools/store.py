"""Pools as data: the ``pools`` table, one row per pool.

A row holds the pool as the pools file writes it (``PoolSpec``) and where it came from:

- ``file``: declared by the pools file (or ``--engine``'s one local pool). At start and on
  SIGHUP the file's set replaces the rows it declared: a pool the file no longer names is
  removed, unless steps are running or queued on it (it stays, and the log says why).
- ``api``: created by ``POST /v1/pools``; removed by ``DELETE /v1/pools/{id}``.
- ``provisioned``: created by ``POST /v1/pools/provision`` once its engines are healthy;
  ``provision`` says which provisioner started them, in which process (``owner``), and its
  idle TTL. Removed by ``DELETE`` or when idle longer than its TTL; its engines stop then.

Every process builds its pools from the rows, at start and at each health refresh
(``PoolRegistry.apply``): a pool created, changed or removed through one process is seen by
the others within ``health_interval_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import clock
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import PoolRow, Step
from orchestratord.pools.config import PoolSpec

Source = Literal["file", "api", "provisioned"]


@dataclass(frozen=True)
class PoolRecord:
    pool_id: str
    source: str
    spec: PoolSpec
    provision: dict[str, Any] | None
    created_at: datetime

    def same_as(self, spec: PoolSpec, source: str) -> bool:
        return self.source == source and as_row(self.spec) == as_row(spec)


@dataclass(frozen=True)
class InUse:
    running: int
    queued: int

    def __bool__(self) -> bool:
        return bool(self.running or self.queued)

    def as_dict(self) -> dict[str, int]:
        return {"running": self.running, "queued": self.queued}


def as_row(spec: PoolSpec) -> dict[str, Any]:
    """The spec as stored: JSON, defaults left out (a row reads back as it was written)."""
    return spec.model_dump(mode="json", exclude_defaults=True)


def _record(row: PoolRow) -> PoolRecord:
    return PoolRecord(
        pool_id=row.pool_id,
        source=row.source,
        spec=PoolSpec.model_validate(row.spec),
        provision=row.provision,
        created_at=row.created_at,
    )


async def read_all(session: AsyncSession) -> dict[str, PoolRecord]:
    rows = (await session.execute(sa.select(PoolRow).order_by(PoolRow.pool_id))).scalars()
    return {row.pool_id: _record(row) for row in rows}


async def read(session: AsyncSession, pool_id: str) -> PoolRecord | None:
    row = await session.get(PoolRow, pool_id)
    return None if row is None else _record(row)


async def put(
    session: AsyncSession,
    spec: PoolSpec,
    source: Source,
    *,
    provision: dict[str, Any] | None = None,
) -> None:
    """Write the pool's row, created or replaced."""
    now = clock.now()
    row = await session.get(PoolRow, spec.pool_id)
    if row is None:
        session.add(
            PoolRow(
                pool_id=spec.pool_id,
                source=source,
                spec=as_row(spec),
                provision=provision,
                created_at=now,
                updated_at=now,
            )
        )
        return
    row.source, row.spec, row.provision, row.updated_at = source, as_row(spec), provision, now


async def remove(session: AsyncSession, pool_id: str) -> bool:
    """Delete the pool's row; whether there was one."""
    result = await session.execute(sa.delete(PoolRow).where(PoolRow.pool_id == pool_id))
    return bool(getattr(result, "rowcount", 0))


async def in_use(session: AsyncSession, pool_id: str) -> InUse:
    """The steps running and queued on the pool now, every process counted."""
    rows = (
        await session.execute(
            sa.select(Step.status, sa.func.count())
            .where(
                Step.pool_id == pool_id,
                Step.status.in_([StepStatus.RUNNING.value, StepStatus.QUEUED.value]),
            )
            .group_by(Step.status)
        )
    ).all()
    counts = {str(status): int(n) for status, n in rows}
    return InUse(
        running=counts.get(StepStatus.RUNNING.value, 0),
        queued=counts.get(StepStatus.QUEUED.value, 0),
    )


async def last_active(session: AsyncSession, pool_id: str) -> datetime | None:
    """When a step on the pool last ended (None: none did)."""
    return (
        await session.execute(sa.select(sa.func.max(Step.ended_at)).where(Step.pool_id == pool_id))
    ).scalar()


async def declare(session: AsyncSession, specs: list[PoolSpec]) -> list[str]:
    """The pools file's set replaces the rows it declared before: each of ``specs`` is
    written (whatever its row's source was: the file names it); a ``file`` row it no longer
    names is removed unless steps run or wait on it. Returns the ids kept for that reason."""
    current = await read_all(session)
    for spec in specs:
        record = current.get(spec.pool_id)
        if record is None or not record.same_as(spec, "file"):
            await put(session, spec, "file")
    named = {spec.pool_id for spec in specs}
    kept = []
    for pool_id, record in current.items():
        if record.source != "file" or pool_id in named:
            continue
        if await in_use(session, pool_id):
            kept.append(pool_id)
            continue
        await remove(session, pool_id)
    return kept
