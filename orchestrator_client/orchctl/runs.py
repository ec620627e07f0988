"""``orchctl runs``: create, list, read, end, cancel and fork runs; ``watch``, ``replay``,
``report``, ``export`` and ``import`` come from their own modules."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator_client.calls import new_token
from orchestrator_client.client import Client
from orchestrator_client.orchctl import render, replay, watch
from orchestrator_client.orchctl.common import (
    EXIT_OK,
    Output,
    UsageError,
    add_client_token,
    add_command,
    add_noun,
    json_object_arg,
    read_object,
)

BUDGETS = ("max_tokens_in", "max_tokens_out", "max_wall_ms", "max_cost_usd")


def run_body(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """The RunCreate body: ``--body``'s file, then each flag given over it."""
    body = read_object(args.body, out.stdin, "a run request") if args.body else {}
    for name in ("mode", "seed", "source_run_id"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    budgets = {k: getattr(args, k) for k in BUDGETS if getattr(args, k) is not None}
    if budgets:
        body["budgets"] = {**(body.get("budgets") or {}), **budgets}
    if args.pin is not None:
        body["pool_policy"] = {"pin": args.pin}
    if args.cancel_on_disconnect:
        body["cancel_on_disconnect"] = True
    body["client_token"] = args.client_token or body.get("client_token") or new_token()
    if body.get("mode") in ("replay", "strict_replay") and not body.get("source_run_id"):
        raise UsageError(f"--mode {body['mode']} needs --source-run-id RUN_ID")
    return body


def cmd_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    created = client.create_run(args.flow_id, run_body(args, out))
    out.show(created, lambda: render.run(created))
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.list_runs(
        flow_id=args.flow, status=args.status, after=args.after, limit=args.limit
    )
    out.show(found, lambda: render.runs(found))
    return EXIT_OK


def cmd_get(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.get_run(args.run_id)
    out.show(found, lambda: render.run(found))
    return EXIT_OK


def cmd_complete(client: Client, args: argparse.Namespace, out: Output) -> int:
    output = json_object_arg(args.output, out.stdin, "--output") if args.output else None
    ended = client.complete_run(args.run_id, args.status, output)
    out.show(ended, lambda: render.run(ended))
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    answer = client.cancel_run(args.run_id)
    out.show(answer, lambda: render.cancelled("run_id", args.run_id, answer))
    return EXIT_OK


def cmd_fork(client: Client, args: argparse.Namespace, out: Output) -> int:
    token = args.client_token or new_token()
    forked = client.fork_run(args.run_id, args.checkpoint_id, client_token=token)
    out.show(forked, lambda: render.run(forked))
    return EXIT_OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(sub, "runs", common=common, help="create, follow, end and replay runs")

    p = add_command(
        verbs,
        "create",
        cmd_create,
        common=common,
        help="start a run of a flow",
        doing="create of a run of {flow_id}",
        description="Start a run of FLOW_ID and print it. The body is --body's file (a "
        "RunCreate JSON object) with each flag given over it.",
        ids=("flow_id",),
    )
    p.add_argument("--body", metavar="FILE", help="the request as JSON ('-' for stdin)")
    p.add_argument("--mode", choices=["record", "replay", "strict_replay"])
    p.add_argument("--seed", type=int, help="the run's seed (default: the server draws one)")
    p.add_argument("--source-run-id", metavar="RUN_ID", help="the recorded run (replay modes)")
    p.add_argument("--max-tokens-in", type=int, metavar="N", help="budget: prompt tokens")
    p.add_argument("--max-tokens-out", type=int, metavar="N", help="budget: output tokens")
    p.add_argument("--max-wall-ms", type=int, metavar="MS", help="budget: wall time")
    p.add_argument("--max-cost-usd", type=float, metavar="USD", help="budget: cost")
    p.add_argument("--pin", metavar="POOL_ID", help="place every step on this pool")
    p.add_argument(
        "--cancel-on-disconnect",
        action="store_true",
        help="cancel a step when its last stream follower leaves",
    )
    add_client_token(p)

    p = add_command(
        verbs,
        "list",
        cmd_list,
        common=common,
        help="list runs, newest first",
        doing="list of runs",
    )
    p.add_argument("--flow", metavar="FLOW_ID", help="only the runs of this flow")
    p.add_argument("--status", help="only runs in this status (running, succeeded, ...)")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100)")
    p.add_argument("--after", metavar="RUN_ID", help="the page after this run (the last shown)")

    p = add_command(
        verbs,
        "get",
        cmd_get,
        common=common,
        help="print a run: status, seed, budgets and their usage",
        doing="get of run {run_id}",
        ids=("run_id",),
    )

    watch.register(verbs, common)

    p = add_command(
        verbs,
        "complete",
        cmd_complete,
        common=common,
        help="end a run (the interpreter's last word); safe to repeat",
        doing="complete of run {run_id}",
        description="End RUN_ID: no more steps or facts. Its stream sends run_end after its "
        "last step ends. Repeating it answers the same run.",
        ids=("run_id",),
    )
    p.add_argument("--status", choices=["succeeded", "failed"], default="succeeded")
    p.add_argument("--output", metavar="JSON", help="the run's output: a JSON object, @FILE or '-'")

    p = add_command(
        verbs,
        "cancel",
        cmd_cancel,
        common=common,
        help="cancel every live step and end the run cancelled; safe to repeat",
        doing="cancel of run {run_id}",
        ids=("run_id",),
    )

    p = add_command(
        verbs,
        "fork",
        cmd_fork,
        common=common,
        help="start a new record run from a checkpoint of a run",
        doing="fork of run {run_id} at {checkpoint_id}",
        ids=("run_id", "checkpoint_id"),
    )
    add_client_token(p)

    replay.register(verbs, common)
