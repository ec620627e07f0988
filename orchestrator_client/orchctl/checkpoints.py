"""``orchctl checkpoints``: store an interpreter's state in a run; list a run's checkpoints."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator_client.calls import new_token
from orchestrator_client.client import Client
from orchestrator_client.orchctl import render
from orchestrator_client.orchctl.common import (
    EXIT_OK,
    Output,
    add_client_token,
    add_command,
    add_noun,
    json_object_arg,
)


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    body: dict[str, Any] = {
        "state": json_object_arg(args.state, out.stdin, "STATE"),
        "client_token": args.client_token or new_token(),
    }
    if args.step_id is not None:
        body["step_id"] = args.step_id
    made = client.checkpoint(args.run_id, body)
    out.show(made, lambda: render.checkpoint(made))
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.list_checkpoints(args.run_id)
    out.show(found, lambda: render.checkpoints(found))
    return EXIT_OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(sub, "checkpoints", common=common, help="store and list checkpoints")

    p = add_command(
        verbs,
        "create",
        cmd_create,
        common=common,
        help="store a state in a run with the server's cursors (runs fork starts from one)",
        doing="checkpoint of {run_id}",
        description="Store STATE (a JSON object, inline, @FILE or '-' for stdin) as a "
        "checkpoint of RUN_ID, with the server's cursors (last fact, last step, usage).",
        ids=("run_id",),
    )
    p.add_argument("state", metavar="STATE", help="a JSON object, e.g. '{\"turn\": 3}'")
    p.add_argument("--step-id", metavar="STEP_ID", help="the step it follows")
    add_client_token(p)

    p = add_command(
        verbs,
        "list",
        cmd_list,
        common=common,
        help="list a run's checkpoints",
        doing="list of the checkpoints of {run_id}",
        ids=("run_id",),
    )
