"""``orchctl facts``: append a fact to a run; list a run's (or a flow's) facts."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator_client.calls import new_token
from orchestrator_client.client import Client
from orchestrator_client.orchctl import render
from orchestrator_client.orchctl.common import (
    EXIT_OK,
    Output,
    UsageError,
    add_client_token,
    add_command,
    add_noun,
    json_arg,
)


def cmd_add(client: Client, args: argparse.Namespace, out: Output) -> int:
    body: dict[str, Any] = {
        "type": args.type,
        "data": json_arg(args.data, out.stdin, "DATA"),
        "client_token": args.client_token or new_token(),
    }
    if args.schema_uri is not None:
        body["schema_uri"] = args.schema_uri
    if args.step_id is not None:
        body["step_id"] = args.step_id
    added = client.add_fact(args.run_id, body)
    out.show(added, lambda: render.fact(added))
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    if (args.run_id is None) == (args.flow is None):
        raise UsageError("facts list takes a RUN_ID or --flow FLOW_ID (one of them)")
    page = {"type": args.type, "after": args.after, "limit": args.limit}
    if args.flow is not None:
        found = client.list_flow_facts(args.flow, **page)
    else:
        found = client.list_facts(args.run_id, **page)
    out.show(found, lambda: render.facts(found))
    return EXIT_OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(sub, "facts", common=common, help="append and list a run's facts")

    p = add_command(
        verbs,
        "add",
        cmd_add,
        common=common,
        help="append a fact to a run",
        doing="add of a {type} fact to {run_id}",
        description="Append a fact of TYPE to RUN_ID; DATA is any JSON but null (inline, "
        "@FILE or '-' for stdin). A flow's fact_schemas check it.",
        ids=("run_id",),
    )
    p.add_argument("type", metavar="TYPE")
    p.add_argument("data", metavar="DATA", help="JSON, e.g. '{\"answer\": 42}'")
    p.add_argument("--schema-uri", metavar="URI")
    p.add_argument("--step-id", metavar="STEP_ID", help="the step that emitted it")
    add_client_token(p)

    p = add_command(
        verbs,
        "list",
        cmd_list,
        common=common,
        help="list a run's facts (or a flow's, --flow) in append order",
        doing=lambda a: f"list of the facts of {a.run_id or a.flow}",
    )
    p.add_argument("run_id", metavar="RUN_ID", nargs="?")
    p.add_argument("--flow", metavar="FLOW_ID", help="the facts of every run of this flow")
    p.add_argument("--type", help="only facts of this type")
    p.add_argument("--after", metavar="FACT_ID", help="the page after this fact (the last shown)")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100)")
