"""The parser and ``main``: options, the client, and how every failure becomes an exit status
and a line on stderr."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from pydantic import ValidationError

from orchestrator_client import __version__
from orchestrator_client.client import Client
from orchestrator_client.errors import ClientError, InvalidRequest
from orchestrator_client.orchctl import checkpoints, facts, flows, pools, replay, runs, steps
from orchestrator_client.orchctl.common import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_STATUS,
    Output,
    UsageError,
    common_options,
    doing_text,
    error_body,
    render_error,
)

DESCRIPTION = """\
orchctl: the command-line client of an orchestratord server.

  orchctl flows create flow.json              store a flow (prints its flow_id)
  orchctl runs create FLOW_ID --seed 7        start a run
  orchctl steps submit RUN_ID --llm-call "Write a haiku." --follow
  orchctl runs watch RUN_ID                   the run live: steps, tokens, budgets, facts
  orchctl runs complete RUN_ID
  orchctl replay RUN_ID --strict              replay a recorded run and judge it (for CI)

Every command takes --json (the answer as JSON, nothing else on stdout) and --url and
--timeout before or after it. The server is --url, else $ORCHCTL_URL, else
$ORCHESTRATOR_URL, else http://127.0.0.1:8080; a server with API keys takes
$ORCHCTL_API_KEY (else $ORCHESTRATOR_API_KEY): never a flag, as argv is public. Errors go
to stderr with the server's code and message; with --json, stdout has {"error": <body>}.
"""


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="orchctl",
        description=DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"orchctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for noun in (flows, runs, steps, facts, checkpoints, pools):
        noun.register(sub, common)
    replay.register(sub, common, alias=True)  # scripts and docs call `orchctl replay ...`
    return parser


def make_client(args: argparse.Namespace) -> Client:
    url = (
        getattr(args, "url", None)
        or os.environ.get("ORCHCTL_URL")
        or os.environ.get("ORCHESTRATOR_URL")
        or DEFAULT_URL
    )
    api_key = os.environ.get("ORCHCTL_API_KEY") or os.environ.get("ORCHESTRATOR_API_KEY")
    timeout: float = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
    return Client(url, timeout=timeout, api_key=api_key or None)


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Run one orchctl command; answers its exit status (argparse exits 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    out = Output(stdout or sys.stdout, stderr or sys.stderr, stdin or sys.stdin, json=args.json)
    try:
        with make_client(args) as client:
            code: int = args.handler(client, args, out)
            return code
    except ValidationError as exc:  # a model orchctl built: refused before it was sent
        return _fail(out, InvalidRequest.of(exc), args)
    except ClientError as exc:
        return _fail(out, exc, args)
    except UsageError as exc:
        out.note(f"orchctl: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        out.note("orchctl: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader left (orchctl ... | head): nothing more to say, and nowhere to say it
        _silence(out.stdout)
        return EXIT_BROKEN_PIPE


def _fail(out: Output, exc: ClientError, args: argparse.Namespace) -> int:
    out.stderr.write(render_error(exc, doing_text(args)))
    out.stderr.flush()
    if out.json:
        out.document({"error": error_body(exc)})
    return EXIT_ERROR


def _silence(stream: TextIO) -> None:
    """Point a closed stdout at /dev/null so the interpreter's flush at exit stays quiet."""
    try:
        fileno = stream.fileno()
    except (AttributeError, ValueError, OSError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)
