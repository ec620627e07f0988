"""What counts as the database being unavailable (``orchestratord/db/outage.py``), and how
the API answers it: without a server, so it runs everywhere (the real outages are in this
folder's other tests)."""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from orchestrator_core.errors import DatabaseUnavailable, StorageFull
from orchestratord.api import errors
from orchestratord.db.outage import connect_failure, unavailable


class _PgError(Exception):
    """A driver error carrying a SQLSTATE, as SQLAlchemy's asyncpg adapter's do."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"state {sqlstate}")
        self.sqlstate = sqlstate


def _wrapped(orig: Exception, *, invalidated: bool = False) -> BaseException:
    return sa.exc.DBAPIError.instance(
        "SELECT 1", (), orig, Exception, connection_invalidated=invalidated
    )


def _sqlite(code: int, text: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(text)
    error.sqlite_errorcode = code
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_wrapped(_PgError("57P01")), DatabaseUnavailable),  # terminating: admin command
        (_wrapped(_PgError("57P03")), DatabaseUnavailable),  # starting up, shutting down
        (_wrapped(_PgError("08006")), DatabaseUnavailable),  # connection failure
        (_wrapped(_PgError("53300")), DatabaseUnavailable),  # too many connections
        (_wrapped(_PgError("53100")), StorageFull),  # disk_full
        (_wrapped(RuntimeError("closed"), invalidated=True), DatabaseUnavailable),
        (_wrapped(_sqlite(13, "database or disk is full")), StorageFull),
        (_sqlite(13, "database or disk is full"), StorageFull),  # raised by the driver itself
        (_wrapped(_PgError("23505")), None),  # a unique violation: the statement's own
        (_wrapped(_PgError("28P01")), None),  # a wrong password: the operator's to fix
        (_wrapped(_sqlite(19, "UNIQUE constraint failed")), None),
        (ConnectionRefusedError(111, "refused"), None),  # not from a database connect
    ],
)
def test_what_is_an_outage(error: BaseException, expected: type[Exception] | None) -> None:
    found = unavailable(error)
    assert (type(found) if found is not None else None) is expected


def test_a_connect_that_fails_is_unavailable_unless_refused_for_its_settings() -> None:
    assert isinstance(connect_failure(ConnectionRefusedError(111, "x")), DatabaseUnavailable)
    assert isinstance(connect_failure(TimeoutError()), DatabaseUnavailable)
    assert isinstance(connect_failure(_PgError("57P03")), DatabaseUnavailable)
    assert connect_failure(_PgError("28P01")) is None  # authentication
    assert connect_failure(_PgError("3D000")) is None  # no such database


async def _answer(error: BaseException) -> httpx.Response:
    app = FastAPI()
    errors.install(app)

    @app.get("/boom")
    async def boom() -> Any:
        raise error

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.get("/boom")


async def test_the_api_answers_an_outage_503_with_retry_after() -> None:
    r = await _answer(_wrapped(_PgError("57P01")))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    body = r.json()
    assert body["code"] == "DATABASE_UNAVAILABLE" and body["retriable"] is True
    assert body["retry_after_ms"] == 1000 and body["details"] == {"reason": "server shutting down"}
    assert "57P01" not in r.text and "SELECT" not in r.text  # never the driver's text


async def test_the_api_answers_a_full_disk_507() -> None:
    r = await _answer(_wrapped(_sqlite(13, "database or disk is full")))
    assert r.status_code == 507 and r.headers["retry-after"] == "30"
    assert r.json()["code"] == "STORAGE_FULL" and r.json()["retriable"] is True


async def test_any_other_database_error_is_still_a_crash() -> None:
    r = await _answer(_wrapped(_PgError("42P01")))  # undefined table: a bug, not an outage
    assert r.status_code == 500
