"""``orchctl pools``: list and read pools; drain and undrain replicas; create a pool from a
file, provision one, delete one (admin)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Group

from orchestrator_client.client import Client
from orchestrator_client.orchctl import render
from orchestrator_client.orchctl.common import (
    EXIT_OK,
    Output,
    UsageError,
    add_command,
    add_noun,
    key_values,
    read_document,
    read_object,
)


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.list_pools()
    out.show(found, lambda: render.pools(found))
    return EXIT_OK


def cmd_get(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.get_pool(args.pool_id)
    out.show(found, lambda: render.pool(found))
    return EXIT_OK


def cmd_drain(client: Client, args: argparse.Namespace, out: Output) -> int:
    change = client.drain_replica if args.drain else client.undrain_replica
    pool = change(args.pool_id, args.replica_id)
    out.show(pool, lambda: render.replicas(pool))
    return EXIT_OK


def pool_specs(document: Any, source: str) -> list[dict[str, Any]]:
    """The pools a file holds: one pool, or a pools file (``{"pools": [...]}``)."""
    specs: list[Any] = [document]
    if isinstance(document, dict) and isinstance(document.get("pools"), list):
        specs = document["pools"]
    if not specs or not all(isinstance(spec, dict) for spec in specs):
        raise UsageError(f"{source} holds no pool (a mapping, or pools: [mapping, ...])")
    return [dict(spec) for spec in specs]


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    specs = pool_specs(read_document(args.file, out.stdin, "a pool"), args.file)
    made = [client.create_pool(spec) for spec in specs]
    out.show(made, lambda: Group(*(render.pool(p) for p in made)))
    return EXIT_OK


def _option(value: str) -> Any:
    """An option's value: JSON when it reads as JSON (``512``, ``true``), else the text."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def provision_body(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    body = read_object(args.file, out.stdin, "a provision request") if args.file else {}
    for name in ("pool_id", "provisioner", "replicas", "slots", "model", "idle_ttl_s"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    tags = key_values(args.tag, "--tag")
    if tags:
        body["tags"] = {**(body.get("tags") or {}), **tags}
    options = {k: _option(v) for k, v in key_values(args.option, "--option").items()}
    if options:
        body["options"] = {**(body.get("options") or {}), **options}
    missing = [name for name in ("pool_id", "provisioner") if not body.get(name)]
    if missing:
        raise UsageError(f"pools provision needs {' and '.join('--' + m for m in missing)}")
    return body


def cmd_provision(client: Client, args: argparse.Namespace, out: Output) -> int:
    pool = client.provision_pool(provision_body(args, out))
    out.show(pool, lambda: render.pool(pool))
    return EXIT_OK


def cmd_delete(client: Client, args: argparse.Namespace, out: Output) -> int:
    client.delete_pool(args.pool_id)
    out.show({"pool_id": args.pool_id, "deleted": True}, lambda: f"deleted pool {args.pool_id}")
    return EXIT_OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(
        sub, "pools", common=common, help="read pools; drain replicas; make and remove pools"
    )
    add_command(
        verbs,
        "list",
        cmd_list,
        common=common,
        help="list pools with health, load and models",
        doing="list of pools",
    )
    p = add_command(
        verbs,
        "get",
        cmd_get,
        common=common,
        help="print a pool and its replicas",
        doing="get of pool {pool_id}",
        ids=("pool_id",),
    )

    for verb, drain, text in (
        ("drain", True, "stop placing steps on a replica; its running steps finish (admin)"),
        ("undrain", False, "let a drained replica take steps again (admin)"),
    ):
        p = add_command(
            verbs,
            verb,
            cmd_drain,
            common=common,
            help=text,
            doing=f"{verb} of {{pool_id}}/{{replica_id}}",
        )
        p.add_argument("pool_id", metavar="POOL_ID")
        p.add_argument("replica_id", metavar="REPLICA_ID")
        p.set_defaults(drain=drain)

    p = add_command(
        verbs,
        "create",
        cmd_create,
        common=common,
        help="create pools from a file, written as pools.yaml writes them (admin)",
        doing="create of a pool from {file}",
        description="Create the pool in FILE ('-': stdin; JSON, or YAML for a .yaml file): "
        "one pool as pools.yaml writes one, or a whole pools file (pools: [...]), each "
        "created in turn. The same body again changes nothing.",
    )
    p.add_argument("file", metavar="FILE")

    p = add_command(
        verbs,
        "provision",
        cmd_provision,
        common=common,
        help="start engines on the server's host and serve them as a pool (admin)",
        doing="provision of a pool",
        description="Start engines through one of the server's provisioners and make a pool "
        "of them; it turns ready once they answer health. The request is FILE's JSON with "
        "each flag given over it. Not retried by the SDK: a repeat may start engines twice.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="the request as JSON ('-': stdin)")
    p.add_argument("--pool-id", metavar="POOL_ID")
    p.add_argument("--provisioner", metavar="NAME", help="llama, llama_cpp_server or a command")
    p.add_argument("--replicas", type=int, metavar="N", help="engines to start (default 1)")
    p.add_argument("--slots", type=int, metavar="N", help="concurrent requests per engine")
    p.add_argument("--model", metavar="MODEL", help="the model (a GGUF path for llama ones)")
    p.add_argument("--idle-ttl-s", type=float, metavar="S", help="remove after S idle; 0 never")
    p.add_argument("--tag", action="append", metavar="KEY=VALUE", help="a tag (repeatable)")
    p.add_argument(
        "--option", action="append", metavar="KEY=JSON", help="a provisioner option (repeatable)"
    )

    p = add_command(
        verbs,
        "delete",
        cmd_delete,
        common=common,
        help="remove a pool made through the API; a provisioned pool's engines stop (admin)",
        doing="delete of pool {pool_id}",
        json_help='print {"pool_id", "deleted": true}',
        ids=("pool_id",),
    )
