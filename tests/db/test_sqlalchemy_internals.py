"""What ``db/prepared.py`` relies on in SQLAlchemy: public API for compiling and converting
(checked here against what SQLAlchemy's own execution applies, for every prepared statement
of the service), and the few attributes of its asyncpg adapter (``ASYNCPG_ADAPTER``) and of
the ORM's session (``ORM_SESSION``) that have none: a SQLAlchemy without one of them is
refused when the database opens, naming it, never run on another path in silence."""

from __future__ import annotations

import ast
import gc
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import create_async_engine

import orchestratord
from orchestratord.db import prepared
from orchestratord.db.engine import Database
from orchestratord.db.prepared import (
    ASYNCPG_ADAPTER,
    ORM_SESSION,
    Prepared,
    _Compiled,
    bind_processor,
    check_asyncpg_adapter,
    check_session,
    result_processor,
)


def test_the_installed_sqlalchemy_has_what_is_used_of_it() -> None:
    check_asyncpg_adapter()  # raises, naming what is missing
    check_session()


def test_a_session_lacking_an_attribute_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy.orm import Session

    monkeypatch.delattr(Session, "_is_clean")
    with pytest.raises(RuntimeError, match="ORM Session has no _is_clean "):
        Database("sqlite:///:memory:")


@pytest.mark.parametrize("name", sorted(ASYNCPG_ADAPTER))
def test_an_adapter_lacking_an_attribute_is_refused_naming_it(name: str) -> None:
    lacking = type("Lacking", (), {n: None for n in ASYNCPG_ADAPTER if n != name})
    with pytest.raises(RuntimeError, match=f"asyncpg adapter has no {name} "):
        check_asyncpg_adapter(lacking)


def test_a_postgresql_database_does_not_open_on_such_a_sqlalchemy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At start, not at its first write, and not by running its writes another way."""
    monkeypatch.delattr(AsyncAdapt_asyncpg_connection, "_call_and_discard")
    with pytest.raises(RuntimeError, match="_call_and_discard"):
        Database("postgresql://postgres@127.0.0.1:5432/nowhere")
    Database("sqlite:///:memory:")  # SQLite uses none of it


def test_the_module_reads_no_private_attribute_but_the_adapters_named_ones() -> None:
    """Every ``obj._name`` in db/prepared.py is one of its own objects' or one named in
    ``ASYNCPG_ADAPTER`` (read off the adapter): a new one must be named there, and checked."""
    tree = ast.parse(Path(prepared.__file__).read_text())
    own = {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    read: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in own
        ):
            base = ast.unparse(node.value)
            read.setdefault(node.attr, set()).add(base)
    assert read == {
        **{name: {"adapted"} for name in ASYNCPG_ADAPTER},
        **{name: {"session"} for name in ORM_SESSION},
    }


def _every_prepared_statement() -> list[Prepared]:
    for module in pkgutil.walk_packages(orchestratord.__path__, "orchestratord."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found = [o for o in gc.get_objects() if isinstance(o, Prepared)]
    assert len(found) >= 10  # the service's (and any a test module made)
    return found


def _dialects() -> list[Dialect]:
    return [
        create_async_engine("sqlite+aiosqlite://").dialect,
        create_async_engine("postgresql+asyncpg://u@127.0.0.1/x").dialect,
    ]


def _same(ours: Any, theirs: Any) -> bool:
    """The same converter: both none, or made by the same code (closures of one factory
    are new objects each time they are asked for, as are the compiled factories')."""
    if ours is None or theirs is None:
        return ours is theirs
    if hasattr(ours, "__code__") or hasattr(theirs, "__code__"):
        return bool(getattr(ours, "__code__", None) == getattr(theirs, "__code__", None))
    return ours == theirs or type(ours) is type(theirs)  # a compiled one's instance


def _same_or_refused(ours: Any, theirs: Any) -> bool:
    """The same converter, or both refuse the column's type (a number type given text's)."""
    try:
        mine = ours()
    except Exception as exc:
        with pytest.raises(type(exc)):
            theirs()
        return True
    return _same(mine, theirs())


@pytest.mark.parametrize("dialect", _dialects(), ids=lambda d: d.name)
def test_public_api_converters_are_those_sqlalchemy_applies(dialect: Dialect) -> None:
    """For every prepared statement of the service: each parameter's converter, the result's
    column types and their converters are those SQLAlchemy's own execution of the same
    statement takes (its compiled statement's private maps, read here only)."""
    checked = 0
    for stmt in _every_prepared_statement():
        ours = _Compiled(stmt.stmt, dialect)
        compiled: Any = stmt.stmt.compile(dialect=dialect)  # type: ignore[attr-defined]
        theirs = compiled._bind_processors
        for (key, _, _, processor), name in zip(ours.params, compiled.positiontup, strict=True):
            bind = compiled.binds[name]
            if bind.key.startswith("%("):  # made by the compilation (SQLite's OFFSET 0):
                assert key.startswith("%("), (key, bind.key)  # named anew by each one
            else:
                assert key == bind.key
            assert _same(processor, theirs.get(name)), (stmt.stmt, name)
        types = [entry.type for entry in compiled._result_columns]
        assert [repr(t) for t in ours._types] == [repr(t) for t in types], stmt.stmt
        assert all(a is b or type(a) is type(b) for a, b in zip(ours._types, types, strict=True))
        coltypes = [None] if dialect.name == "sqlite" else [20, 25, 701, 1184, 1700, 3802]
        for ours_type, their_type in zip(ours._types, types, strict=True):
            for coltype in coltypes:  # asyncpg's OIDs: int8, text, float8, timestamptz...
                assert _same_or_refused(
                    lambda: result_processor(ours_type, dialect, coltype),  # noqa: B023
                    lambda: their_type._cached_result_processor(dialect, coltype),  # noqa: B023
                ), (stmt.stmt, ours_type, coltype)
        checked += 1
    assert checked >= 10


def test_a_type_decorators_processors_are_its_own() -> None:
    """``bind_processor``/``result_processor`` go through a TypeDecorator (the JSON columns'
    codec) as SQLAlchemy's execution does."""
    import sqlalchemy as sa

    class Doubled(sa.types.TypeDecorator[int]):
        impl = sa.Integer
        cache_ok = True

        def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
            return None if value is None else value * 2

        def process_result_value(self, value: Any, dialect: Dialect) -> Any:
            return None if value is None else value // 2

    dialect = _dialects()[0]
    bind = bind_processor(Doubled(), dialect)
    result = result_processor(Doubled(), dialect, None)
    assert bind is not None and result is not None
    assert bind(21) == 42 and result(42) == 21


def test_the_inline_sqlite_connection_has_all_sqlalchemys_aiosqlite_adapter_reads() -> None:
    """``InlineConnection`` stands in for aiosqlite's connection under SQLAlchemy's adapter,
    private attributes included (``_conn``, ``_tx``, ``_connection``): whatever the installed
    adapter reads of it is there (else SQLite in a file would fail at its first statement)."""
    import inspect
    import re
    import sqlite3

    from sqlalchemy.dialects.sqlite import aiosqlite

    from orchestratord.db.inline_sqlite import InlineConnection

    adapter = inspect.getsource(aiosqlite.AsyncAdapt_aiosqlite_connection)
    read = set(re.findall(r"self\._connection\.(\w+)", adapter))
    assert {"_conn", "_tx", "_connection"} <= read
    inline = InlineConnection(sqlite3.connect(":memory:"))
    try:
        assert {name for name in read if not hasattr(inline, name)} == set()
    finally:
        inline.stop()
