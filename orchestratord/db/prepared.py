"""Core statements of the hot paths, executed on the database's driver directly.

Through an ``AsyncSession`` every statement crosses SQLAlchemy's async layer (a greenlet
switch each way), then its execution context (the compiled cache, parameter processing, a
result object): about 40 µs of Python around a statement that SQLite runs in 1-2 µs here.
On the SQLite file databases this service serves, the driver connection runs inline on the
event loop (``inline_sqlite.py``), so a hot statement can be run on it directly; on
PostgreSQL it runs on the asyncpg connection under SQLAlchemy's: inside the transaction that
connection holds, compiled once, its parameters and results converted by the very
processors SQLAlchemy would apply (asked of the types through their public API:
``dialect_impl(dialect).bind_processor`` / ``result_processor``). Elsewhere (an in-memory
SQLite database behind aiosqlite's thread) the statement goes through the session.

Callers see one interface, ``await stmt.rows(tx, params)``: a list of plain tuples, the
statement's columns in order, whichever way it ran. ``tx`` is a service's transaction
(``orchestratord.tx.Tx``) or, for reads, a session. A ``Tx`` of prepared statements alone
has no session at all: on SQLite its transaction is begun on the process's one writer
connection (``_SqliteTx``), on PostgreSQL on asyncpg under a connection the process keeps
checked out (``_PgTx``); see ``Database.write_tx``. Those, and ``_Target`` (where a statement
runs), are this package's own.

One thing has no public API: running a statement on asyncpg inside the transaction that
SQLAlchemy's asyncpg adapter holds (its lock, its BEGIN and COMMIT, its cache of prepared
statements, its translation of errors). ``ASYNCPG_ADAPTER`` names each attribute of the
adapter used for it, and why; ``check_asyncpg_adapter`` refuses to start on a SQLAlchemy
whose adapter lacks one (pyproject.toml pins the minor version they were read from). One
more, ``ORM_SESSION``, has a public equivalent that costs more on every statement.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

from sqlalchemy import event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction, class_mapper, make_transient_to_detached
from sqlalchemy.sql import ClauseElement, Executable, Select
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE, ForUpdateArg, SelectBase
from sqlalchemy.sql.type_api import TypeEngine
from sqlalchemy.sql.visitors import iterate
from sqlalchemy.types import TupleType

from orchestratord.db.inline_sqlite import InlineConnection
from orchestratord.db.outage import broken_protocol

if TYPE_CHECKING:
    from orchestratord.tx import Tx

_NO_DRIVER = "prepared.no_driver"
_DRIVER = "prepared.driver"
_CONNECTION = "prepared.connection"
_ASYNCPG = "prepared.asyncpg"

_T = TypeVar("_T")
_Processor = Callable[[Any], Any] | None


def bind_processor(type_: TypeEngine[Any], dialect: Dialect) -> _Processor:
    """What SQLAlchemy applies to a parameter of this type before the driver gets it."""
    return type_.dialect_impl(dialect).bind_processor(dialect)


def result_processor(type_: TypeEngine[Any], dialect: Dialect, coltype: Any) -> _Processor:
    """What SQLAlchemy applies to a value of this type the driver returned (``coltype``: the
    driver's type of the column, asyncpg's OID; ``None`` on SQLite)."""
    return type_.dialect_impl(dialect).result_processor(dialect, coltype)


def result_columns(stmt: Executable) -> list[ColumnElement[Any]]:
    """The columns of the statement's rows, in order: a SELECT's, a RETURNING's."""
    if isinstance(stmt, SelectBase | UpdateBase):
        return list(stmt.exported_columns)
    return []


class _Compiled:
    """The statement compiled for one dialect: its SQL, where each positional parameter
    comes from (a caller's key or a literal of the statement), and the converters."""

    __slots__ = ("_dialect", "_types", "params", "results", "sql")

    def __init__(self, stmt: Executable, dialect: Dialect) -> None:
        compiled = cast(ClauseElement, stmt).compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        binds = compiled.binds
        self.sql: str = compiled.string
        self.params: list[tuple[str, bool, Any, _Processor]] = []
        for name in compiled.positiontup or ():
            bind = binds[name]
            if bind.expanding or isinstance(bind.type, TupleType):
                raise ValueError(f"{name}: an expanding or tuple parameter cannot be prepared")
            # a literal of the statement (``status == 'running'``) is taken from it
            literal = not bind.required and bind.callable is None
            self.params.append((bind.key, literal, bind.value, bind_processor(bind.type, dialect)))
        self._dialect = dialect
        self._types = [column.type for column in result_columns(stmt)]
        # some of asyncpg's processors depend on the column's type in the result (its OID):
        # known at the first execution (``typed``)
        self.results: list[_Processor] | None = None
        if dialect.driver != "asyncpg":
            self.results = self.typed([None] * len(self._types))

    def typed(self, coltypes: list[Any]) -> list[_Processor]:
        """The result's converters, given the types its columns came back with."""
        dialect = self._dialect
        return [result_processor(t, dialect, c) for t, c in zip(self._types, coltypes, strict=True)]

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
class _SqliteTx:
    """A SQLite write transaction on the driver connection alone, no session."""

    sqlite: sqlite3.Connection
    dialect: Dialect


@dataclass(slots=True)
class _PgTx:
    """A PostgreSQL write transaction run on asyncpg itself (no session), under a connection
    the process holds (``Database.write_tx``); ``origin`` names the process's writes.

    Its transaction begins at its first statement that writes or locks (``begun``): a plain
    ``SELECT`` before it runs on its own, as under READ COMMITTED every statement reads its
    own snapshot anyway (no round trip for ``BEGIN`` ahead of reads). A write that is the
    transaction's last statement may run alone, with no ``BEGIN`` or ``COMMIT`` at all, when
    nothing began before it (``Prepared.rows(alone=True)``); the transaction is then over
    (``ended``). Both are this object's own record of what it asked of the connection."""

    conn: AsyncConnection
    asyncpg: Any  # SQLAlchemy's adapter of the asyncpg connection (``ASYNCPG_ADAPTER``)
    origin: str
    begun: bool = False
    ended: bool = False

    @property
    def dialect(self) -> Dialect:
        return self.conn.dialect

    def check_open(self) -> None:
        if self.ended:
            raise RuntimeError("this transaction ended with a statement run alone")


# where a prepared statement runs: a session's transaction, or a driver's alone
_Target: TypeAlias = AsyncSession | _SqliteTx | _PgTx
_TARGETS = (AsyncSession, _SqliteTx, _PgTx)

# what a statement is given to run on: a service's transaction (it says where), a session
# (a read's), or (inside this package) a target itself
On: TypeAlias = "Tx | _Target"


def _target(on: On) -> _Target:
    return on if isinstance(on, _TARGETS) else on.target


def nothing_written(on: On) -> None:
    """The statement just run alone wrote nothing (as its rows tell its caller): the
    transaction goes on, and may begin."""
    target = _target(on)
    if isinstance(target, _PgTx):
        target.ended = False


def can_run_alone(on: On) -> bool:
    """A statement run on ``on`` with ``alone=True`` would commit by itself: a PostgreSQL
    transaction on asyncpg in which nothing has begun (nor a session joined)."""
    target = _target(on)
    return isinstance(target, _PgTx) and not target.begun and not target.ended


@dataclass(slots=True)
class _Route:
    """How a statement of a target runs: on SQLite's driver inline, on asyncpg, or through
    SQLAlchemy's Core on the session's connection (the first of them that is set)."""

    dialect: Dialect
    sqlite: sqlite3.Connection | None = None
    asyncpg: Any | None = None
    conn: AsyncConnection | None = None


async def _route(target: _Target) -> _Route:
    if isinstance(target, _SqliteTx):
        return _Route(target.dialect, sqlite=target.sqlite)
    if isinstance(target, _PgTx):
        return _Route(target.dialect, asyncpg=target.asyncpg, conn=target.conn)
    session = target.sync_session
    if not session._is_clean():  # (``ORM_SESSION``)
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
        self.reads = _reads_only(stmt)  # ``_PgTx`` runs it before BEGIN

    def compiled(self, dialect: Dialect) -> _Compiled:
        compiled = self._compiled.get(dialect.name)
        if compiled is None:
            compiled = self._compiled[dialect.name] = _Compiled(self.stmt, dialect)
        return compiled

    async def rows(
        self, on: On, params: Mapping[str, Any] | None = None, *, alone: bool = False
    ) -> list[tuple[Any, ...]]:
        """The statement's rows. ``alone``: the caller writes nothing more in this
        transaction; where nothing has begun in it (``can_run_alone``) the statement runs on
        its own and commits by itself, and the transaction is over."""
        target = on if isinstance(on, _TARGETS) else on.target
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
        self, on: On, params: Mapping[str, Any] | None = None, *, alone: bool = False
    ) -> tuple[Any, ...] | None:
        rows = await self.rows(on, params, alone=alone)
        return rows[0] if rows else None


def _begins(target: _Target, *, reads: bool, alone: bool) -> bool:
    """Whether a statement on asyncpg begins the target's transaction (if none has begun):
    not a read, nor a write run alone, ahead of anything else in a ``_PgTx``."""
    if not isinstance(target, _PgTx):
        return True
    target.check_open()
    begin = target.begun or not (reads or alone)
    if begin:
        target.begun = True
    return begin


def _ran(target: _Target, *, begin: bool, alone: bool) -> None:
    """A write ran alone, and committed: its ``_PgTx`` is over."""
    if alone and not begin:
        assert isinstance(target, _PgTx)
        target.ended = True


def _reads_only(stmt: Executable) -> bool:
    """A SELECT that writes nothing and locks nothing: no FOR UPDATE (nor FOR SHARE...) and
    no INSERT, UPDATE or DELETE in a WITH, anywhere in it. (A SELECT of a function that
    writes or locks, an advisory lock, must not be prepared: it would run outside the
    transaction.)"""
    if not isinstance(stmt, Select):
        return False
    for element in iterate(stmt):
        if isinstance(element, ForUpdateArg):
            return False
        if isinstance(element, CTE) and isinstance(element.element, UpdateBase):
            return False
    return True


async def driver_sql(
    on: On, sql: str, params: Any, *, many: bool = False, alone: bool = False
) -> list[tuple[Any, ...]]:
    """SQL in the driver's own dialect (its paramstyle, no conversions), on SQLite's driver
    where it runs inline, on asyncpg, else on the session's connection; the rows it
    returns. ``alone`` as for ``Prepared.rows``."""
    target = _target(on)
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


def dialect_of(on: On) -> Dialect:
    target = _target(on)
    return target.get_bind().dialect if isinstance(target, AsyncSession) else target.dialect


def origin_of(on: On) -> str | None:
    """The process that writes in ``on`` (PostgreSQL; ``None`` on SQLite)."""
    target = _target(on)
    if isinstance(target, _PgTx):
        return target.origin
    return None if isinstance(target, _SqliteTx) else target.info.get("origin")


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
    """SQLAlchemy's asyncpg adapter of the connection (the DBAPI connection of its pool
    entry), or ``None`` on another driver; ``RuntimeError`` if it lacks what is used of it."""
    if conn.dialect.driver != "asyncpg":
        return None
    adapted = conn.sync_connection.connection.dbapi_connection  # type: ignore[union-attr]
    check_asyncpg_adapter(adapted)
    return adapted


# What ``run_on_asyncpg`` and ``commit_on_asyncpg`` use of SQLAlchemy's asyncpg adapter
# (sqlalchemy/dialects/postgresql/asyncpg.py, AsyncAdapt_asyncpg_connection) that has no
# public API, and why: a statement run here must be one the session's own cursor would have
# run, in the same transaction, so that SQLAlchemy commits or rolls back what began here and
# the reverse. Read from SQLAlchemy 2.1 (pyproject.toml pins it); checked when the database
# opens (``check_asyncpg_adapter``) and by tests/db/test_sqlalchemy_internals.py.
ASYNCPG_ADAPTER: dict[str, str] = {
    "_execute_mutex": "the lock the adapter's cursor holds around each statement: ours never "
    "interleave with a session's on the same connection",
    "_transaction": "the asyncpg transaction the adapter holds (None when none has begun): a "
    "statement joins it, and COMMIT ends it",
    "_start_transaction": "BEGIN as the adapter begins it (its isolation level, read only, "
    "deferrable), recorded where its own commit and rollback look",
    "_prepare": "the adapter's cache of prepared statements: one PREPARE per statement and "
    "connection, shared with the session's cursor, with the columns' types",
    "_invalidate_schema_cache_asof": "the argument ``_prepare`` takes (when the connection's "
    "cached types were last reloaded)",
    "_handle_exception": "asyncpg's errors raised as the DBAPI errors SQLAlchemy wraps "
    "(IntegrityError...), and a closed connection's transaction forgotten",
    "_call_and_discard": "COMMIT as the adapter commits: the transaction is forgotten "
    "whether or not COMMIT succeeds",
}


# What is used of the ORM's Session that has no public API of the same cost, and why
ORM_SESSION: dict[str, str] = {
    "_is_clean": "whether the session holds anything to flush before a statement (what its "
    "autoflush asks): the public new, dirty and deleted build a set each, every time (about "
    "5 µs more per statement run in a session, measured)",
}


def check_session(session: Any = Session) -> None:
    """Refuse (``RuntimeError``) a SQLAlchemy whose ORM ``Session`` lacks an attribute of
    ``ORM_SESSION``."""
    missing = [name for name in ORM_SESSION if not hasattr(session, name)]
    if missing:
        raise _lacking("its ORM Session", missing, "uses it")


def check_asyncpg_adapter(adapter: Any = None) -> None:
    """Refuse (``RuntimeError``) a SQLAlchemy whose asyncpg adapter (``adapter``, an
    instance, or else its class) lacks an attribute of ``ASYNCPG_ADAPTER``."""
    if adapter is None:
        from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

        adapter = AsyncAdapt_asyncpg_connection
    missing = [name for name in ASYNCPG_ADAPTER if not hasattr(adapter, name)]
    if missing:
        raise _lacking("its asyncpg adapter", missing, "runs statements on it")


def _lacking(what: str, missing: list[str], use: str) -> RuntimeError:
    """The error refusing a SQLAlchemy whose ``what`` lacks the attributes ``missing``
    (``use``: what this module does with it)."""
    import sqlalchemy

    return RuntimeError(
        f"SQLAlchemy {sqlalchemy.__version__}: {what} has no {', '.join(missing)} "
        f"(orchestratord/db/prepared.py {use}; install the version pyproject.toml names)"
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
                await adapted.driver_connection.executemany(sql, params)
                return [], ()
            prepared, columns = await adapted._prepare(sql, adapted._invalidate_schema_cache_asof)
            return await prepared.fetch(*params), columns
        except Exception as exc:
            wrapped, disconnect = _translated(adapted, conn, sql, params, exc)
    if disconnect:
        await conn.invalidate(wrapped)
    raise wrapped


async def commit_on_asyncpg(adapted: Any, conn: AsyncConnection) -> None:
    """COMMIT what ``run_on_asyncpg`` began, if anything (a session joined to the same
    connection may have committed it already: the adapter says); errors as SQLAlchemy
    raises them (a refused deferred constraint, a lost connection). (A transaction that
    fails is rolled back by the pool its connection goes back to.)"""
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
    # (a protocol left in a state it cannot leave is a lost connection too: db/outage.py)
    disconnect = conn.dialect.is_disconnect(error, adapted, None) or broken_protocol(error)
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
