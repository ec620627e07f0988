"""A database that cannot serve, told apart from one that refused a statement.

What says "the database is down, restarting, unreachable, or lost the connection under a
transaction" is ``DatabaseUnavailable`` (503, retriable), and "its storage is full" is
``StorageFull`` (507); the API answers both with the contract's error body and
``Retry-After`` (``api/errors.py``), and the background loops (dispatcher, lease keeper)
wait for the database instead of logging a failure per round.

Where each comes from:

- a connection that cannot be made (refused, timed out, the server starting up or shutting
  down, too many connections) is raised as ``DatabaseUnavailable`` by the engine itself
  (``install_pg_hooks``: the pool's connect), so no other ``OSError`` is ever taken for it;
- a statement's error keeps SQLAlchemy's type on its way up (callers tell a constraint
  from a lost connection by it, the event log's retries among them), and where it is
  answered ``unavailable`` reads it: a ``DBAPIError`` with ``connection_invalidated`` (the
  pool drops that connection), or a SQLSTATE of the classes that mean the same (``08``,
  ``57P0x``, ``53300``);
- SQLite's ``SQLITE_FULL`` and PostgreSQL's ``disk_full`` (``53100``) are ``StorageFull``.

A pooled PostgreSQL connection that the server closed while it sat idle (a restart closes
them all) is dropped when it is checked out, not handed to a request that would fail on it:
asyncpg knows it is closed, so the check costs no round trip (``install_pg_hooks``). The
connections ``db/held.py`` keeps between transactions are not checked out: the first
transaction that finds one broken fails, and the others held are let go with it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator_core.errors import DatabaseUnavailable, StorageFull

SQLITE_FULL = 13  # sqlite3.SQLITE_FULL: "database or disk is full"
PG_DISK_FULL = "53100"
# SQLSTATEs of a server that is not serving this connection, by prefix
_PG_UNAVAILABLE = {
    "08": "connection lost",  # connection_exception: the whole class
    "57P01": "server shutting down",  # admin_shutdown ("terminating connection due to ...")
    "57P02": "server crashed",  # crash_shutdown
    "57P03": "server starting up or shutting down",  # cannot_connect_now
    "53300": "too many connections",
}

Outage = DatabaseUnavailable | StorageFull


def unavailable(exc: BaseException) -> Outage | None:
    """The project's error for ``exc`` when it says the database cannot serve (down,
    restarting, the connection lost, its storage full), else None: a statement refused for
    what it asked (a constraint, a type) is not an outage."""
    if isinstance(exc, DatabaseUnavailable | StorageFull):
        return exc
    if isinstance(exc, DBAPIError):
        found = _of_driver(exc.orig)
        if found is None and exc.connection_invalidated:
            return DatabaseUnavailable("connection lost")
        return found
    if isinstance(exc, sqlite3.Error):  # raised by the driver itself (BEGIN, COMMIT inline)
        return _of_driver(exc)
    return None


def described(exc: BaseException) -> str:
    """One line for a log: the error's first line (a driver's error goes on with the SQL
    and its parameters)."""
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _of_driver(error: BaseException | None) -> Outage | None:
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF == SQLITE_FULL) or "disk is full" in str(error):
            return StorageFull()
        return None
    state = getattr(error, "sqlstate", None)
    if not isinstance(state, str):
        return None
    if state == PG_DISK_FULL:
        return StorageFull()
    for prefix, reason in _PG_UNAVAILABLE.items():
        if state.startswith(prefix):
            return DatabaseUnavailable(reason)
    return None


def broken_protocol(error: BaseException | None) -> bool:
    """asyncpg's ``InternalClientError`` (as raised, or as SQLAlchemy's adapter re-raises
    it): the connection's protocol is in a state it cannot leave, as when the server's
    FATAL "terminating connection" arrived while it sat idle (a restart). It is as good as
    lost, though its socket may not be closed yet: SQLAlchemy does not count it as a
    disconnect, so it would go back to the pool and fail the next request too."""
    return error is not None and type(error).__name__ == "InternalClientError"


def connect_failure(exc: BaseException, dbapi: Any = None) -> DatabaseUnavailable | None:
    """Why a new connection could not be made, when it is the server's state or the
    network (not the settings: a wrong password or database name stays the driver's
    error, an operator's to fix). ``dbapi``: the driver's DBAPI module, whose
    ``InterfaceError`` is a connection that broke while it was being made."""
    if isinstance(exc, TimeoutError):
        return DatabaseUnavailable("connect timed out")
    if isinstance(exc, ConnectionRefusedError):
        return DatabaseUnavailable("connection refused")
    if isinstance(exc, OSError):  # unreachable, reset, a name that does not resolve now
        return DatabaseUnavailable("cannot connect")
    found = _of_driver(exc)
    if isinstance(found, DatabaseUnavailable):
        return found
    interface_error = getattr(dbapi, "InterfaceError", None)
    if interface_error is not None and isinstance(exc, interface_error):
        return DatabaseUnavailable("connection lost while connecting")
    return None


def install_pg_hooks(engine: AsyncEngine) -> None:
    """A connection the server cannot make is ``DatabaseUnavailable``; a pooled one it
    closed meanwhile is replaced at checkout; one whose protocol broke is invalidated."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except Exception as exc:
            failure = connect_failure(exc, dialect.loaded_dbapi)
            if failure is None:
                raise
            raise failure from exc

    @event.listens_for(engine.sync_engine, "handle_error")
    def _lost(context: Any) -> None:
        if not context.is_disconnect and broken_protocol(context.original_exception):
            context.is_disconnect = True  # invalidated, never pooled again

    @event.listens_for(engine.sync_engine, "checkout")
    def _checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            # the pool drops it and connects anew (a restart closed it while it was idle)
            raise DisconnectionError("the server closed this pooled connection")
