"""``orchctl flows``: store a flow from a file, read one back by id or content hash."""

from __future__ import annotations

import argparse

from orchestrator_client.client import Client
from orchestrator_client.orchctl import render
from orchestrator_client.orchctl.common import (
    EXIT_OK,
    Output,
    UsageError,
    add_command,
    add_noun,
    key_values,
    read_object,
)


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    body = read_object(args.file, out.stdin, "a flow")
    labels = key_values(args.label, "--label")
    if labels:
        body["labels"] = {**(body.get("labels") or {}), **labels}
    created = client.create_flow(body)
    out.show(created, lambda: render.flow_created(created))
    return EXIT_OK


def cmd_get(client: Client, args: argparse.Namespace, out: Output) -> int:
    if (args.flow_id is None) == (args.hash is None):
        raise UsageError("flows get takes a FLOW_ID or --hash HASH (one of them)")
    flow = (
        client.get_flow(args.flow_id) if args.hash is None else client.get_flow_by_hash(args.hash)
    )
    out.show(flow, lambda: render.flow(flow))
    return EXIT_OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(sub, "flows", common=common, help="store and read flows")
    p = add_command(
        verbs,
        "create",
        cmd_create,
        common=common,
        help="store a flow from a file (the same content answers the same flow_id)",
        doing="create of a flow from {file}",
        description="Store the flow in FILE ('-': stdin), a JSON object "
        '{"ast", "tools", "config", "labels"} (a .yaml file is read as YAML), and print its '
        "flow_id and content hash. Storing the same content again answers the same flow.",
    )
    p.add_argument("file", metavar="FILE", help="the flow as JSON ('-' for stdin)")
    p.add_argument(
        "--label",
        action="append",
        metavar="KEY=VALUE",
        help="a label (repeatable; labels are not content, the first stored are kept)",
    )

    p = add_command(
        verbs,
        "get",
        cmd_get,
        common=common,
        help="print a flow: its ast, tools, config and labels",
        doing=lambda a: f"get of flow {a.flow_id or a.hash}",
    )
    p.add_argument("flow_id", metavar="FLOW_ID", nargs="?")
    p.add_argument("--hash", metavar="HASH", help="find the flow by its content hash instead")
