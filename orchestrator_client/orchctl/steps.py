"""``orchctl steps``: submit a step (from JSON or shorthand flags) and follow it; read,
list, cancel and stream steps.

A followed step prints its tokens to stdout as they come (with ``--json``: every event, one
JSON object a line) and how it ended to stderr; exit status 1 when it ended in ``error`` or
was cancelled.
"""

from __future__ import annotations

import argparse
from typing import Any

from contracts.events import EndEvent, ErrorEvent, TokenEvent, ToolSuggestEvent
from orchestrator_client.calls import new_token
from orchestrator_client.client import Client
from orchestrator_client.orchctl import render
from orchestrator_client.orchctl.common import (
    EXIT_FAILED,
    EXIT_OK,
    Output,
    UsageError,
    add_client_token,
    add_command,
    add_noun,
    compact,
    json_object_arg,
    read_object,
)

SHORTHANDS = ("llm_call", "tool", "gate")


def step_body(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """The step request: FILE's JSON, or the one shorthand given; then the common flags."""
    given = [name for name in SHORTHANDS if getattr(args, name) is not None]
    if args.file is not None:
        given.insert(0, "FILE")
    if len(given) != 1:
        raise UsageError(
            "steps submit takes one step: FILE (or '-'), --llm-call PROMPT, --tool NAME or "
            f"--gate EXPR (given: {', '.join(given) or 'none'})"
        )
    if args.file is not None:
        body = read_object(args.file, out.stdin, "a step request")
    elif args.llm_call is not None:
        params: dict[str, Any] = {"max_tokens": args.max_tokens}
        if args.temperature is not None:
            params["temperature"] = args.temperature
        if args.stop:
            params["stop"] = args.stop
        llm: dict[str, Any] = {"prompt": args.llm_call, "params": params}
        if args.model is not None:
            llm["model"] = args.model
        body = {"type": "llm_call", "input": llm}
    elif args.tool is not None:
        tool_args = json_object_arg(args.args, out.stdin, "--args") if args.args else {}
        body = {"type": "tool_call", "input": {"tool": args.tool, "args": tool_args}}
    else:
        gate: dict[str, Any] = {"expr": args.gate}
        if args.wait_ms is not None:
            gate["wait_ms"] = args.wait_ms
        body = {"type": "gate_eval", "input": gate}
    if args.pin is not None:
        body["placement"] = {"pin": args.pin}
    if args.priority is not None:
        body["priority"] = args.priority
    body["client_token"] = args.client_token or body.get("client_token") or new_token()
    return body


def follow(client: Client, step_id: str, out: Output, *, after: str | None = None) -> int:
    """Print the step's stream to its end: tokens (or, with ``--json``, each event as a JSON
    line) on stdout as they come, how it ended on stderr. 0 succeeded, 1 error or cancelled."""
    tokens = 0
    for event in client.stream_step(step_id, last_event_id=after):
        if out.json:
            out.stdout.write(compact(event) + "\n")
            out.stdout.flush()
        elif isinstance(event, TokenEvent):
            out.stdout.write(event.t)
            out.stdout.flush()
            tokens += 1
        elif isinstance(event, ToolSuggestEvent):
            state = "valid" if event.valid else f"invalid: {compact(event.errors)}"
            out.note(f"orchctl: {step_id} suggests {event.tool} {compact(event.args)} ({state})")
        if isinstance(event, EndEvent):
            if not out.json:
                _ended_output(client, step_id, out, streamed=tokens > 0)
                out.note(
                    f"orchctl: {step_id} end ({event.stop_reason}), "
                    f"{event.tokens_in} tokens in, {event.tokens_out} out"
                )
            return EXIT_FAILED if event.stop_reason == "cancelled" else EXIT_OK
        if isinstance(event, ErrorEvent):
            if tokens and not out.json:
                out.stdout.write("\n")
            out.note(f"orchctl: {step_id} error: {event.code}: {event.message}")
            return EXIT_FAILED
    return EXIT_OK  # the SDK raises Unreachable rather than end a stream without its end


def _ended_output(client: Client, step_id: str, out: Output, *, streamed: bool) -> None:
    """After the text streamed, a line end; a step that streamed no text (a tool call, a
    gate, a checkpoint) prints its output instead, as one line of JSON."""
    if streamed:
        out.stdout.write("\n")
    else:
        output = client.get_step(step_id).output
        if output:
            out.stdout.write(compact(output) + "\n")
    out.stdout.flush()


def cmd_submit(client: Client, args: argparse.Namespace, out: Output) -> int:
    accepted = client.submit_step(args.run_id, step_body(args, out))
    if not args.follow:
        out.show(accepted, lambda: render.accepted(accepted))
        return EXIT_OK
    if not out.json:
        out.note(f"orchctl: {accepted.step_id} {accepted.status}")
    return follow(client, accepted.step_id, out)


def cmd_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.list_steps(args.run_id)
    out.show(found, lambda: render.steps(found))
    return EXIT_OK


def cmd_get(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.get_step(args.step_id)
    out.show(found, lambda: render.step(found))
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    answer = client.cancel_step(args.step_id)
    out.show(answer, lambda: render.cancelled("step_id", args.step_id, answer))
    return EXIT_OK


def cmd_stream(client: Client, args: argparse.Namespace, out: Output) -> int:
    return follow(client, args.step_id, out, after=args.after)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    verbs = add_noun(sub, "steps", common=common, help="submit, read, cancel and stream steps")

    p = add_command(
        verbs,
        "submit",
        cmd_submit,
        common=common,
        help="submit a step to a run, from JSON or shorthand flags",
        doing="submit of a step to {run_id}",
        description="Submit a step to RUN_ID: FILE ('-': stdin) holds the request as JSON\n"
        '({"type", "input", ...}), or one shorthand builds it:\n'
        "  --llm-call PROMPT [--max-tokens N] [--temperature T] [--stop S] [--model M]\n"
        "  --tool NAME [--args JSON]\n"
        "  --gate EXPR [--wait-ms MS]\n"
        "With --follow, its tokens are printed as they stream (exit 1 if it fails).",
        json_help="print the answer as JSON; with --follow, every event as a JSON line",
        ids=("run_id",),
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="the step request as JSON")
    p.add_argument("--llm-call", metavar="PROMPT", help="an llm_call of PROMPT")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N", help="default: 256")
    p.add_argument("--temperature", type=float, metavar="T")
    p.add_argument("--stop", action="append", metavar="TEXT", help="a stop string (repeatable)")
    p.add_argument("--model", metavar="MODEL", help="the model the step needs")
    p.add_argument("--tool", metavar="NAME", help="a tool_call of the flow's tool NAME")
    p.add_argument("--args", metavar="JSON", help="the tool's args: a JSON object, @FILE or '-'")
    p.add_argument("--gate", metavar="EXPR", help="a gate_eval of a CEL expression")
    p.add_argument("--wait-ms", type=int, metavar="MS", help="gate: wait for facts up to MS")
    p.add_argument("--pin", metavar="POOL_ID", help="place the step on this pool")
    p.add_argument("--priority", choices=["interactive", "batch"])
    p.add_argument("--follow", "-f", action="store_true", help="stream the step to its end")
    add_client_token(p)

    p = add_command(
        verbs,
        "list",
        cmd_list,
        common=common,
        help="list a run's steps by position",
        doing="list of the steps of {run_id}",
        ids=("run_id",),
    )

    p = add_command(
        verbs,
        "get",
        cmd_get,
        common=common,
        help="print a step: status, output, usage, placement",
        doing="get of step {step_id}",
        ids=("step_id",),
    )

    p = add_command(
        verbs,
        "cancel",
        cmd_cancel,
        common=common,
        help="cancel a step (a running one winds down); safe to repeat",
        doing="cancel of step {step_id}",
        ids=("step_id",),
    )

    p = add_command(
        verbs,
        "stream",
        cmd_stream,
        common=common,
        help="print a step's tokens as they stream, to its end",
        doing="stream of step {step_id}",
        description="Follow STEP_ID's stream to its end (resuming after drops): its tokens "
        "on stdout as they come, how it ended on stderr. Exit 1 when it ended in error or "
        "was cancelled.",
        json_help="print every event as one JSON object a line",
        ids=("step_id",),
    )
    p.add_argument("--after", metavar="EVENT_ID", help="start after this event id (seq)")
