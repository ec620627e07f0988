"""Writes a client may retry: a ``client_token`` makes a repeat answer the first record.

A fact, a checkpoint or a run created with a ``client_token`` stores the token and the hash
of the request (its body, the token left out) on its row, under a unique index per run (per
flow for runs). A repeat of the same request finds that row and answers it (200, nothing
written); the same token with another body is refused (409 ``CONFLICT`` naming
``client_token``). Two repeats at once: one inserts, the other's insert meets the index
(SQLite serializes writers; on PostgreSQL the second transaction's insert fails), rolls back,
and answers the row the first wrote.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import Conflict
from orchestratord.db.engine import Database
from orchestratord.tx import Tx


class Tokened(Protocol):
    client_token: str | None
    request_hash: str | None


Row = TypeVar("Row", bound=Tokened)
Out = TypeVar("Out")


@dataclass(frozen=True)
class Token:
    value: str
    request_hash: str

    @classmethod
    def of(cls, body: BaseModel) -> Token | None:
        """The request's token and hash; None for a request without one."""
        value = getattr(body, "client_token", None)
        if value is None:
            return None
        request = body.model_dump(mode="json", exclude={"client_token"})
        return cls(value=value, request_hash=sha256_of(request))

    def stamp(self, row: Tokened) -> None:
        row.client_token, row.request_hash = self.value, self.request_hash


async def first_of(session: AsyncSession, model: type[Row], scope: Any, token: Token) -> Row | None:
    """The row a request with ``token`` wrote in ``scope`` (a column compared), if any;
    ``Conflict`` when it was another request."""
    column = sa.inspect(model).columns["client_token"]
    found = (
        await session.execute(sa.select(model).where(scope, column == token.value))
    ).scalar_one_or_none()
    if found is not None and found.request_hash != token.request_hash:
        raise Conflict(
            f"client_token {token.value!r} was used with another request: a retry sends the "
            "same body, a new request a new token",
            details={"field": "client_token"},
        )
    return found


async def answer_once(
    db: Database,
    tx: Callable[[], Any],
    token: Token | None,
    find: Callable[[AsyncSession, Token], Awaitable[Out | None]],
    make: Callable[[Tx], Awaitable[Out]],
) -> tuple[Out, bool]:
    """Make a record in a transaction of ``tx()``, once per token: the first record when the
    token was seen (``find``), else ``make``'s. Returns it and whether it was made here."""
    if token is None:
        async with tx() as t:
            return await make(t), True
    try:
        async with tx() as t:
            first = await find(t.session, token)
            if first is not None:
                return first, False
            return await make(t), True
    except IntegrityError:  # a concurrent repeat wrote first: this insert met the index
        async with db.read() as session:
            first = await find(session, token)
        if first is None:  # another constraint: not a repeat
            raise
        return first, False
