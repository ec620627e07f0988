"""Core statements of the hot paths, executed on SQLite's driver connection directly.

Through an ``AsyncSession`` every statement crosses SQLAlchemy's async layer (a greenlet
switch each way), then its execution context (the compiled cache, parameter processing, a
result object): about 40 µs of Python around a statement that SQLite runs in 1-2 µs here.
On the SQLite file databases this service serves, the driver connection runs inline on the
event loop (``inline_sqlite.py``), so a hot statement can be run on it directly, inside the
session's transaction: compiled once, its parameters and results converted by the very
processors SQLAlchemy would apply. Elsewhere (PostgreSQL, an in-memory SQLite database
behind aiosqlite's thread) the same statement goes through the session as before.

Callers see one interface, ``await stmt.rows(target, params)``: a list of plain tuples,
the statement's columns in order, whichever way it ran. The target is a session, or a write
transaction with no session at all, for work made of prepared statements alone (a
submission, a batch of events, a step's end): a ``DriverTx`` on SQLite (begun on the
process's one writer connection), a ``PgTx`` on PostgreSQL (begun on asyncpg under a
connection the process keeps checked out); see ``Database.write_tx``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction, class_mapper, make_transient_to_detached
from sqlalchemy.sql import Executable, Select
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.selectable import CTE
from sqlalchemy.sql.visitors import iterate

from orchestratord.db.inline_sqlite import InlineConnection

_NO_DRIVER = "prepared.no_driver"
_DRIVER = "prepared.driver"
_CONNECTION = "prepared.connection"
_ASYNCPG = "prepared.asyncpg"

_T = TypeVar("_T")
_Processor = Callable[[Any], Any] | None


class _Compiled:
    """The statement compiled for one dialect: its SQL, where each positional parameter
    comes from (a caller's key or a literal of the statement), and the converters."""

    __slots__ = ("_dialect", "_types", "params", "results", "sql")

    def __init__(self, stmt: Executable, dialect: Dialect) -> None:
        compiled: Any = stmt.compile(dialect=dialect)  # type: ignore[attr-defined]
        binds = compiled.binds
        processors = compiled._bind_processors
        self.sql: str = compiled.string
        self.params: list[tuple[str, bool, Any, _Processor]] = []
        for name in compiled.positiontup or ():
            bind = binds[name]
            if bind.expanding:
                raise ValueError(f"{name}: an expanding parameter cannot be prepared")
            # a literal of the statement (``status == 'running'``) is taken from it
            literal = not bind.required and bind.callable is None
            self.params.append((bind.key, literal, bind.value, processors.get(name)))
        self._dialect = dialect
        self._types = [entry.type for entry in compiled._result_columns]
        # some of asyncpg's processors depend on the column's type in the result (its OID):
        # known at the first execution (``typed``)
        self.results: list[_Processor] | None = None
        if dialect.driver != "asyncpg":
            self.results = self.typed([None] * len(self._types))

    def typed(self, coltypes: list[Any]) -> list[_Processor]:
        """The result's converters, given the types its columns came back with."""
        return [
            t._cached_result_processor(self._dialect, c)
            for t, c in zip(self._types, coltypes, strict=True)
        ]

    def bound(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        out = []
        for key, literal, value, processor in self.params:
            v = value if literal else values[key]
            out.append(v if processor is None else processor(v))
        return tuple(out)

    def rows(self, cursor: sqlite3.Cursor) -> list[tuple[Any, ...]]:
        return self.convert(cursor.fetchall())

    def convert(self, fetched: list[Any]) -> list[tuple[Any, ...]]:
        """Rows (tuples, or asyncpg's records) as tuples, each value converted."""
        results = self.results
        if not fetched or results is None or not any(results):
            return (
                [tuple(row) for row in fetched]
                if fetched and type(fetched[0]) is not tuple
                else fetched
            )
        return [
            tuple(v if p is None or v is None else p(v) for v, p in zip(row, results, strict=True))
            for row in fetched
        ]


@dataclass(frozen=True, slots=True)
class DriverTx:
    """A SQLite write transaction on the driver connection alone, no session
    (``Database.driver_write``): for work made only of prepared statements."""

    sqlite: sqlite3.Connection
    dialect: Dialect


@dataclass(slots=True)
class PgTx:
    """A PostgreSQL write transaction run on asyncpg itself (no session), under a connection
    the process holds (``Database.write_tx``); ``origin`` names the process's writes.

    Its transaction begins at its first statement that writes or locks: a plain ``SELECT``
    before it runs on its own, as under READ COMMITTED every statement reads its own snapshot
    anyway (no round trip for ``BEGIN`` ahead of reads). A write that is the transaction's
    last statement may run alone, with no ``BEGIN`` or ``COMMIT`` at all, when nothing began
    before it (``Prepared.rows(alone=True)``); the transaction is then over (``ended``)."""

    conn: AsyncConnection
    asyncpg: Any  # SQLAlchemy's adapter of the asyncpg connection (``_ADAPTER_API``)
    origin: str
    ended: bool = False

    @property
    def dialect(self) -> Dialect:
        return self.conn.dialect

    @property
    def begun(self) -> bool:
        return self.asyncpg._transaction is not None

    def check_open(self) -> None:
        if self.ended:
            raise RuntimeError("this transaction ended with a statement run alone")


def nothing_written(target: Target) -> None:
    """The statement just run alone wrote nothing (as its rows tell its caller): the
    transaction goes on, and may begin."""
    if isinstance(target, PgTx):
        target.ended = False


def can_run_alone(target: Target) -> bool:
    """A statement run on ``target`` with ``alone=True`` would commit by itself: a PostgreSQL
    transaction on asyncpg in which nothing has begun (nor a session joined)."""
    return isinstance(target, PgTx) and not target.begun and not target.ended


# where a prepared statement runs: a session's transaction, or a driver's alone
Target = AsyncSession | DriverTx | PgTx


@dataclass(slots=True)
class _Route:
    """How a statement of a target runs: on SQLite's driver inline, on asyncpg, or through
    SQLAlchemy's Core on the session's connection (the first of them that is set)."""

    dialect: Dialect
    sqlite: sqlite3.Connection | None = None
    asyncpg: Any | None = None
    conn: AsyncConnection | None = None


async def _route(target: Target) -> _Route:
    if isinstance(target, DriverTx):
        return _Route(target.dialect, sqlite=target.sqlite)
    if isinstance(target, PgTx):
        return _Route(target.dialect, asyncpg=target.asyncpg, conn=target.conn)
    if not target.sync_session._is_clean():
        await target.flush()  # what the session would autoflush before the statement
    driver = await sqlite_driver(target)
    if driver is not None:
        return _Route(target.get_bind().dialect, sqlite=driver)
    conn = await _connection(target)
    return _Route(conn.dialect, asyncpg=await _asyncpg_of(target, conn), conn=conn)


class Prepared:
    """A Core statement of a hot path (see the module's docstring)."""

    __slots__ = ("_compiled", "reads", "stmt")

    def __init__(self, stmt: Executable) -> None:
        self.stmt = stmt
        self._compiled: dict[str, _Compiled] = {}  # by dialect name
        self.reads = _reads_only(stmt)  # ``PgTx`` runs it before BEGIN

    def compiled(self, dialect: Dialect) -> _Compiled:
        compiled = self._compiled.get(dialect.name)
        if compiled is None:
            compiled = self._compiled[dialect.name] = _Compiled(self.stmt, dialect)
        return compiled

    async def rows(
        self, target: Target, params: Mapping[str, Any] | None = None, *, alone: bool = False
    ) -> list[tuple[Any, ...]]:
        """The statement's rows. ``alone``: the caller writes nothing more in this
        transaction; where nothing has begun in it (``can_run_alone``) the statement runs on
        its own and commits by itself, and the transaction is over."""
        route = await _route(target)
        compiled = self.compiled(route.dialect)
        if route.sqlite is not None:
            return run_on_driver(
                route.sqlite, compiled.sql, compiled.bound(params or {}), compiled.rows
            )
        assert route.conn is not None
        if route.asyncpg is not None:  # on asyncpg itself, in the target's transaction
            bound = compiled.bound(params or {})
            begin = _begins(target, reads=self.reads, alone=alone)
            records, columns = await run_on_asyncpg(
                route.asyncpg, route.conn, compiled.sql, bound, begin=begin
            )
            _ran(target, begin=begin, alone=alone)
            if compiled.results is None:
                compiled.results = compiled.typed([c.type.oid for c in columns])
            return compiled.convert(records)
        # a Core statement: on the session's connection, past the ORM
        result = await route.conn.execute(self.stmt, params)
        return [tuple(row) for row in result.all()] if result.returns_rows else []

    async def first(
        self, target: Target, params: Mapping[str, Any] | None = None, *, alone: bool = False
    ) -> tuple[Any, ...] | None:
        rows = await self.rows(target, params, alone=alone)
        return rows[0] if rows else None


def _begins(target: Target, *, reads: bool, alone: bool) -> bool:
    """Whether a statement on asyncpg begins the target's transaction (if none has begun):
    not a read, nor a write run alone, ahead of anything else in a ``PgTx``."""
    if not isinstance(target, PgTx):
        return True
    target.check_open()
    return target.begun or not (reads or alone)


def _ran(target: Target, *, begin: bool, alone: bool) -> None:
    """A write ran alone, and committed: its ``PgTx`` is over."""
    if alone and not begin:
        assert isinstance(target, PgTx)
        target.ended = True


def _reads_only(stmt: Executable) -> bool:
    """A SELECT that writes nothing and locks nothing: no FOR UPDATE, no INSERT, UPDATE or
    DELETE in a WITH. (A SELECT of a function that writes or locks, an advisory lock, must
    not be prepared: it would run outside the transaction.)"""
    if not isinstance(stmt, Select) or stmt._for_update_arg is not None:
        return False
    ctes = [*stmt._independent_ctes, *(e for e in iterate(stmt) if isinstance(e, CTE))]
    return not any(isinstance(cte.element, UpdateBase) for cte in ctes)


async def driver_sql(
    target: Target, sql: str, params: Any, *, many: bool = False, alone: bool = False
) -> list[tuple[Any, ...]]:
    """SQL in the driver's own dialect (its paramstyle, no conversions), on SQLite's driver
    where it runs inline, on asyncpg, else on the session's connection; the rows it
    returns. ``alone`` as for ``Prepared.rows``."""
    route = await _route(target)
    if route.sqlite is not None:
        return run_on_driver(route.sqlite, sql, params, many=many)
    assert route.conn is not None
    if route.asyncpg is not None:
        begin = _begins(target, reads=False, alone=alone)
        records, _ = await run_on_asyncpg(
            route.asyncpg, route.conn, sql, params, many=many, begin=begin
        )
        _ran(target, begin=begin, alone=alone)
        return [tuple(r) for r in records]
    result = await route.conn.exec_driver_sql(sql, params)
    return [tuple(row) for row in result.all()] if result.returns_rows else []


def dialect_of(target: Target) -> Dialect:
    return target.get_bind().dialect if isinstance(target, AsyncSession) else target.dialect


def origin_of(target: Target) -> str | None:
    """The process that writes in ``target`` (PostgreSQL; ``None`` on SQLite)."""
    if isinstance(target, PgTx):
        return target.origin
    return None if isinstance(target, DriverTx) else target.info.get("origin")


async def sqlite_driver(session: AsyncSession) -> sqlite3.Connection | None:
    """The session's SQLite connection when it runs inline on the loop, its transaction
    begun; ``None`` where statements must go through the session."""
    info = session.info
    if _NO_DRIVER in info:
        return None
    driver = info.get(_DRIVER)
    if driver is not None:
        return driver  # type: ignore[no-any-return]
    if session.get_bind().dialect.name != "sqlite":
        info[_NO_DRIVER] = True
        return None
    conn = await session.connection()  # begins the session's transaction
    adapted = conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]
    if not isinstance(adapted, InlineConnection):
        info[_NO_DRIVER] = True
        return None
    info[_DRIVER] = adapted.sqlite
    return adapted.sqlite


async def _connection(session: AsyncSession) -> AsyncConnection:
    """The session's connection in this transaction (asked for once per transaction)."""
    conn = session.info.get(_CONNECTION)
    if conn is None:
        conn = session.info[_CONNECTION] = await session.connection()
    return conn


async def _asyncpg_of(session: AsyncSession, conn: AsyncConnection) -> Any | None:
    """SQLAlchemy's asyncpg connection adapter under ``conn`` (the session's, in this
    transaction), or ``None`` on another driver."""
    adapted = session.info.get(_ASYNCPG)
    if adapted is None:
        adapted = asyncpg_adapter(conn)
        if adapted is not None:
            session.info[_ASYNCPG] = adapted
    return adapted


def asyncpg_adapter(conn: AsyncConnection) -> Any | None:
    """SQLAlchemy's asyncpg adapter of the connection, or ``None`` on another driver (or a
    SQLAlchemy other than the one this was written against: the Core path then)."""
    if conn.dialect.driver != "asyncpg":
        return None
    fairy = conn.sync_connection.connection  # type: ignore[union-attr]
    adapted = fairy.dbapi_connection
    return adapted if all(hasattr(adapted, a) for a in _ADAPTER_API) else None


# what run_on_asyncpg uses of SQLAlchemy's asyncpg adapter (sqlalchemy/dialects/postgresql/
# asyncpg.py): the same mutex, transaction, statement cache and error translation its cursor
# uses, so a statement run here is one the session's own would have been
_ADAPTER_API = (
    "_execute_mutex",
    "_transaction",
    "_start_transaction",
    "_prepare",
    "_invalidate_schema_cache_asof",
    "_handle_exception",
    "_connection",
    "_call_and_discard",
)


async def run_on_asyncpg(
    adapted: Any,
    conn: AsyncConnection,
    sql: str,
    params: Any,
    *,
    many: bool = False,
    begin: bool = True,
) -> tuple[list[Any], Any]:
    """SQL in asyncpg's paramstyle on the asyncpg connection under ``conn``, inside its
    transaction (begun here as SQLAlchemy's cursor would begin it, unless ``begin`` is false:
    then, where none has begun, on its own): its records and its columns' attributes. Errors
    are raised as SQLAlchemy raises them, and a connection lost is invalidated."""
    async with adapted._execute_mutex:
        try:
            if begin and adapted._transaction is None:
                await adapted._start_transaction()
            if many:
                await adapted._connection.executemany(sql, params)
                return [], ()
            prepared, columns = await adapted._prepare(sql, adapted._invalidate_schema_cache_asof)
            return await prepared.fetch(*params), columns
        except Exception as exc:
            wrapped, disconnect = _translated(adapted, conn, sql, params, exc)
    if disconnect:
        await conn.invalidate(wrapped)
    raise wrapped


async def commit_on_asyncpg(adapted: Any, conn: AsyncConnection) -> None:
    """COMMIT what ``run_on_asyncpg`` began, if it began anything; errors as SQLAlchemy raises
    them (a refused deferred constraint, a lost connection). (A transaction that fails is
    rolled back by the pool its connection goes back to.)"""
    async with adapted._execute_mutex:
        transaction = adapted._transaction
        if transaction is None:
            return
        try:  # the adapter forgets the transaction whether or not this succeeds
            await adapted._call_and_discard(transaction.commit)
            return
        except Exception as exc:
            wrapped, disconnect = _translated(adapted, conn, "COMMIT", (), exc)
    if disconnect:
        await conn.invalidate(wrapped)
    raise wrapped


def _translated(
    adapted: Any, conn: AsyncConnection, sql: str, params: Any, exc: Exception
) -> tuple[Exception, bool]:
    """An error of asyncpg as SQLAlchemy would raise it, and whether the connection is lost."""
    error: Exception = exc
    dbapi_error = conn.dialect.loaded_dbapi.Error
    if not isinstance(exc, dbapi_error):
        try:
            adapted._handle_exception(exc)  # raises the DBAPI's translation
        except dbapi_error as translated:
            error = translated
        except Exception as other:
            return other, False
    if not isinstance(error, dbapi_error):
        return error, False
    disconnect = conn.dialect.is_disconnect(error, adapted, None)
    wrapped = DBAPIError.instance(
        sql, params, error, dbapi_error, connection_invalidated=disconnect, dialect=conn.dialect
    )
    wrapped.__cause__ = error
    return wrapped, disconnect


@event.listens_for(Session, "after_transaction_end")
def _forget_connection(session: Session, transaction: SessionTransaction) -> None:
    # the next transaction of the session may run on another pooled connection
    if transaction.parent is None:
        session.info.pop(_DRIVER, None)
        session.info.pop(_CONNECTION, None)
        session.info.pop(_ASYNCPG, None)


def run_on_driver(
    driver: sqlite3.Connection,
    sql: str,
    params: Any,
    rows: Callable[[sqlite3.Cursor], list[tuple[Any, ...]]] = sqlite3.Cursor.fetchall,
    *,
    many: bool = False,
) -> list[tuple[Any, ...]]:
    """Run SQL on the driver; its rows, if it returns any. The driver's errors are raised as
    SQLAlchemy raises them (``IntegrityError``...), so callers handle one family."""
    try:
        cursor = driver.executemany(sql, params) if many else driver.execute(sql, params)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc
    try:
        return rows(cursor) if cursor.description is not None else []
    finally:
        cursor.close()


def transient(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """A new instance of a mapped class holding ``values``, as its constructor makes one (no
    identity, nothing loaded), without the constructor's per-attribute events (a 37-column
    step: 29 µs through the constructor, 1.4 µs this way). A session it is added to inserts
    what it holds."""
    obj = class_mapper(cls).class_manager.new_instance()
    obj.__dict__.update(values)
    return obj


def detached(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """An instance of a mapped class from a row's values (every column), as a closed session
    leaves what it loaded: detached, nothing pending."""
    obj = transient(cls, values)
    make_transient_to_detached(obj)
    return obj
