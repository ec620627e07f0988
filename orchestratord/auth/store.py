"""The ``api_keys`` rows: created, listed, revoked, found. One writer: these functions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core import keys
from orchestrator_core.clock import now
from orchestrator_core.errors import NotFound
from orchestratord.db.models import ApiKey


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as listed: never its secret or digest."""

    key_id: str
    name: str | None
    scope: str
    created_at: datetime
    revoked_at: datetime | None


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(row.key_id, row.name, row.scope, row.created_at, row.revoked_at)


async def create(
    session: AsyncSession, *, scope: keys.Scope, name: str | None, pepper: str = ""
) -> str:
    """Store a new key; returns its text, which is not kept anywhere. ``pepper``: the
    service's ``auth.pepper`` (every process verifying the key must hold the same)."""
    new = keys.new_key(pepper)
    session.add(
        ApiKey(
            key_id=new.key_id,
            name=name,
            scope=scope.label,
            salt=new.salt,
            digest=new.digest,
            created_at=now(),
        )
    )
    await session.flush()
    return new.text


async def listing(session: AsyncSession) -> list[KeyInfo]:
    rows = await session.scalars(sa.select(ApiKey).order_by(ApiKey.created_at, ApiKey.key_id))
    return [_info(r) for r in rows]


async def revoke(session: AsyncSession, *, key_id: str) -> KeyInfo:
    row = await session.get(ApiKey, key_id)
    if row is None:
        raise NotFound("key", key_id)
    if row.revoked_at is None:
        row.revoked_at = now()
        await session.flush()
    return _info(row)


async def rehash(session: AsyncSession, *, key_id: str, digest: str) -> None:
    """Store a key's digest again, of the current scheme (on the first use of an old one)."""
    await session.execute(sa.update(ApiKey).where(ApiKey.key_id == key_id).values(digest=digest))


async def find(session: AsyncSession, *, key_id: str) -> ApiKey | None:
    return await session.get(ApiKey, key_id)


async def any_key(session: AsyncSession) -> bool:
    """Whether a key was ever made (revoked ones count: revoking the last key keeps auth on)."""
    return (await session.scalar(sa.select(ApiKey.key_id).limit(1))) is not None
