"""``orchestratord serve``, ``orchestratord keys create|list|revoke`` and
``orchestratord db upgrade|current``."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
from pathlib import Path
from typing import Any

from orchestratord import __version__
from orchestratord.api.correlation import CorrelationLogFilter
from orchestratord.db.single_process import DatabaseInUse, SingleProcessLock
from orchestratord.event_logging import JsonFormatter
from orchestratord.pools.config import PoolConfigError, load_pools_file
from orchestratord.settings import BadSetting, Settings, load_settings
from worker_adapters.registry import local_engines, runs_locally


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "database_url", "engine"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "pools", None) is not None:
        overrides["pools_file"] = Path(args.pools)
    settings = load_settings(**overrides)
    if getattr(args, "auth", False):
        settings.auth.enabled = True
    if getattr(args, "evergreen_port", None) is not None:
        settings.evergreen.port = args.evergreen_port
    return settings


def configure_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(CorrelationLogFilter())
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(correlation_id)s] %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchestratord.api.app import create_app

    settings = _settings(args)
    check_prices(settings)
    if settings.pools_file is not None:
        try:
            load_pools_file(settings.pools_file)
        except PoolConfigError as exc:
            print(f"orchestratord: invalid pools file:\n{exc}", file=sys.stderr)
            return 2
    public = not is_loopback(settings.host) and not args.insecure
    if public and not settings.auth.enabled and not asyncio.run(keys_exist(settings)):
        print(
            f"orchestratord: refusing to serve on {settings.host} with auth off: anyone who "
            "can reach the port could read and write every run. Create a key (orchestratord "
            "keys create --scope admin), pass --auth, or pass --insecure to serve anyway.",
            file=sys.stderr,
        )
        return 2
    lock = SingleProcessLock.for_url(settings.database_url)
    if lock is not None:  # refuse here, before the server starts, with a plain message
        try:
            lock.acquire()
        except DatabaseInUse as exc:
            print(f"orchestratord: {exc}", file=sys.stderr)
            return 2
        lock.hand_over()  # held on for the orchestrator the server starts
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop=settings.loop,
        http=settings.http,
        log_level=settings.log_level,
        log_config=None,
        timeout_graceful_shutdown=2,  # after the drain, streams are already ended
        timeout_keep_alive=75,  # longer than the idle timeout of usual load balancers
    )
    from orchestratord.draining import DrainingServer

    DrainingServer(config, app, drain_s=settings.dispatch.drain_s).run()
    return 0


def check_prices(settings: Settings) -> None:
    """The price tables load and name ``price_table``, or ``BadSetting`` (before the server
    starts: a start that fails later is a traceback in the log and exit 3)."""
    from orchestrator_core.errors import NotFound
    from orchestratord.prices import PriceBook, PriceConfigError

    try:
        book = (
            PriceBook.load(settings.price_tables_dir)
            if settings.price_tables_dir is not None
            else PriceBook.load()
        )
    except PriceConfigError as exc:
        first = str(exc).splitlines()[0]
        raise BadSetting([f"ORCHESTRATORD_PRICE_TABLES_DIR: {first}"]) from None
    if settings.price_table is not None:
        try:
            book.get(settings.price_table)
        except NotFound:
            known = ", ".join(book.versions()) or "none"
            line = f"ORCHESTRATORD_PRICE_TABLE: no such price table (accepts one of: {known})"
            raise BadSetting([line]) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve to anything


async def keys_exist(settings: Settings) -> bool:
    from orchestratord.auth import store
    from orchestratord.db.engine import Database
    from orchestratord.db.migrate import upgrade

    db = Database(settings.database_url)
    try:
        await upgrade(db)
        async with db.read() as session:
            return await store.any_key(session)
    finally:
        await db.dispose()


def keys_command(args: argparse.Namespace) -> int:
    from orchestrator_core.errors import NotFound
    from orchestrator_core.keys import Scope
    from orchestratord.auth import store
    from orchestratord.db.engine import Database
    from orchestratord.db.migrate import upgrade

    settings = _settings(args)

    async def go() -> int:
        db = Database(settings.database_url)
        try:
            await upgrade(db)
            if args.action == "create":
                async with db.write() as session:
                    text = await store.create(
                        session,
                        scope=Scope.parse(args.scope),
                        name=args.name,
                        pepper=settings.auth.pepper,
                    )
                print(text)
                print(
                    "(shown once: only its hash is stored; it works in every process within "
                    f"{settings.auth.cache_s:g} s)",
                    file=sys.stderr,
                )
                return 0
            if args.action == "revoke":
                try:
                    async with db.write() as session:
                        info = await store.revoke(session, key_id=args.key_id)
                except NotFound:
                    print(f"orchestratord: no key {args.key_id}", file=sys.stderr)
                    return 1
                print(
                    f"revoked {info.key_id} ({info.scope}); refused everywhere within "
                    f"{settings.auth.cache_s:g} s"
                )
                return 0
            async with db.read() as session:
                listed = await store.listing(session)
            for k in listed:
                state = f"revoked {k.revoked_at.isoformat()}" if k.revoked_at else "active"
                print(f"{k.key_id}  {k.scope:<5}  {state:<33}  {k.name or ''}".rstrip())
            return 0
        finally:
            await db.dispose()

    return asyncio.run(go())


def db_command(args: argparse.Namespace) -> int:
    from orchestratord.db.engine import Database
    from orchestratord.db.migrate import current_revision, head_revision, upgrade

    settings = _settings(args)

    async def go() -> int:
        db = Database(settings.database_url)
        try:
            if args.action == "upgrade":
                await upgrade(db)
            current = await current_revision(db)
            print(f"current: {current} head: {head_revision()}")
            return 0 if current == head_revision() else 1
        finally:
            await db.dispose()

    return asyncio.run(go())


def _local_engine(name: str) -> str:
    # looked up when given, so that commands other than serve import no engine module
    if not runs_locally(name):
        choices = ", ".join(local_engines())
        raise argparse.ArgumentTypeError(f"{name!r} is not an engine that runs locally: {choices}")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestratord", description=__doc__)
    parser.add_argument("--version", action="version", version=f"orchestratord {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the HTTP/SSE server")
    p_serve.add_argument("--host")
    p_serve.add_argument("--port", type=int)
    p_serve.add_argument("--database-url", help="sqlite:///path or postgresql://...")
    p_serve.add_argument(
        "--engine",
        type=_local_engine,
        metavar="ENGINE",
        help="engine of the local pool: a registered engine that needs no url (sim, llama)",
    )
    p_serve.add_argument("--pools", metavar="FILE", help="YAML file of pools")
    p_serve.add_argument(
        "--evergreen-port",
        type=int,
        metavar="N",
        help="also serve the Evergreen gRPC front door on this port (docs/evergreen.md)",
    )
    p_serve.add_argument(
        "--auth", action="store_true", help="require an API key even before any key exists"
    )
    p_serve.add_argument(
        "--insecure",
        action="store_true",
        help="serve on a non-loopback address with auth off (anyone reaching it has admin)",
    )
    p_serve.set_defaults(func=serve)
    p_keys = sub.add_parser("keys", help="API keys: create (printed once), list, revoke")
    keys_sub = p_keys.add_subparsers(dest="action", required=True)
    p_create = keys_sub.add_parser("create", help="make a key and print it once")
    p_create.add_argument("--scope", required=True, choices=["read", "write", "admin"])
    p_create.add_argument("--name", help="what the key is for")
    p_list = keys_sub.add_parser("list", help="every key: id, scope, state, name")
    p_revoke = keys_sub.add_parser("revoke", help="refuse a key from now on")
    p_revoke.add_argument("key_id", help="the 12 hex digits after ok_")
    for p in (p_create, p_list, p_revoke):
        p.add_argument("--database-url")
        p.set_defaults(func=keys_command)
    p_db = sub.add_parser("db", help="database migrations")
    p_db.add_argument("action", choices=["upgrade", "current"])
    p_db.add_argument("--database-url")
    p_db.set_defaults(func=db_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except BadSetting as exc:
        for line in exc.lines:
            print(f"orchestratord: bad setting {line}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
