"""orchctl: the command-line client of an orchestratord server.

Replay a recorded run and check that it reproduces token for token (for CI):

  orchctl --url http://127.0.0.1:8080 replay run_01J... --strict

Exit status: 0 the replay is complete and identical; 1 it diverged, missed a recorded step,
a step failed or was not replayed; 2 the replay could not start (the server refused the run:
the reason and each mismatch are printed), the server answered an error, or it could not be
reached. Errors go to stderr with the server's code and message.

A server with API keys: set ORCHCTL_API_KEY (replays need a write key, import an admin key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from orchestrator_client import __version__
from orchestrator_client.client import (
    ApiError,
    Client,
    ClientError,
    JsonObject,
    StepReplay,
    replay_run,
)

DEFAULT_URL = "http://127.0.0.1:8080"  # orchestratord serve's default host and port
EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
OUTCOMES = ("identical", "diverged", "missed", "failed", "pending", "not_replayed")


# --- pure parts: verdicts, exit codes, rendering --------------------------------------------


def verdict(report: JsonObject) -> str:
    """One word for a replay report: IDENTICAL, DIVERGED, MISSED, FAILED or INCOMPLETE."""
    counts = report.get("counts") or {}
    if counts.get("diverged"):
        return "DIVERGED"
    if counts.get("missed"):
        return "MISSED"
    if counts.get("failed"):
        return "FAILED"
    if report.get("diverged"):  # the server's flag covers all three
        return "DIVERGED"
    if not report.get("complete"):
        return "INCOMPLETE"
    return "IDENTICAL"


def exit_code(report: JsonObject) -> int:
    """0 when the report is complete and nothing diverged, missed or failed; else 1."""
    return EXIT_OK if verdict(report) == "IDENTICAL" else EXIT_FAILED


def render_token(value: Any) -> str:
    """An expected/actual token of a divergence: ``' river' (token_id 7)`` or ``end (eos)``."""
    if isinstance(value, dict):
        if "end" in value:
            return f"end of output ({value['end']})"
        if "t" in value:
            token_id = value.get("token_id")
            suffix = f" (token_id {token_id})" if token_id is not None else ""
            return f"{value['t']!r}{suffix}"
        if "error" in value:
            return f"error {value['error']}"
    if value is None:
        return "nothing"
    return json.dumps(value, ensure_ascii=False)


def render_tokens(value: Any) -> str:
    """Context tokens, each as repr() so whitespace shows."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        if not value:
            return "(none)"
        return " ".join(
            repr(item["t"]) if isinstance(item, dict) and "t" in item else repr(item)
            for item in value
        )
    return json.dumps(value, ensure_ascii=False)


def render_context(value: Any) -> list[tuple[str, str]]:
    """(label, tokens) rows of a divergence's context: ``{"before": [...], ...}`` or a list."""
    if isinstance(value, dict):
        return [(f"context {key.replace('_', ' ')}", render_tokens(v)) for key, v in value.items()]
    return [("context", render_tokens(value))]


def render_divergence(divergence: JsonObject, indent: str = "      ") -> list[str]:
    rows = [
        ("expected", render_token(divergence.get("expected"))),
        ("actual", render_token(divergence.get("actual"))),
    ]
    if divergence.get("context") is not None:
        rows.extend(render_context(divergence["context"]))
    width = max(len(label) for label, _ in rows) + 1
    where = ", ".join(
        f"{label} {divergence[key]}"
        for label, key in (("step", "step_id"), ("recorded", "recorded_step_id"))
        if divergence.get(key)
    )
    head = f"{indent}diverged at token {divergence.get('token_index')}"
    return [head + (f" ({where})" if where else "")] + [
        f"{indent}  {(label + ':').ljust(width)} {text}" for label, text in rows
    ]


MISS_SHOWN_ELSEWHERE = ("position", "source_run_id", "recorded_step_id")


def render_miss(miss: JsonObject, indent: str = "      ") -> list[str]:
    """A REPLAY_MISS: which inputs differ from the recorded step, with both values."""
    differs = miss.get("differs")
    line = f"{indent}no recorded step matches"
    if isinstance(differs, list):
        line += f"; differs: {', '.join(map(str, differs))}"
    lines = [line]
    if miss.get("message"):
        lines.append(f"{indent}  {miss['message']}")
    for item in miss.get("inputs") or []:
        if isinstance(item, dict):
            lines.append(
                f"{indent}  {item.get('input')}: recorded {_value(item.get('recorded'))}, "
                f"submitted {_value(item.get('submitted'))}"
            )
    known = ("differs", "message", "inputs", *MISS_SHOWN_ELSEWHERE)
    rest = {k: v for k, v in miss.items() if k not in known}
    if rest:
        lines.append(f"{indent}  {json.dumps(rest, ensure_ascii=False, sort_keys=True)}")
    return lines


def render_report(report: JsonObject, replay_run_id: str | None = None) -> str:
    """The human-readable report: a verdict header, one line per step, divergences in full."""
    counts = report.get("counts") or {}
    run_id = replay_run_id or report.get("run_id")
    lines = [
        f"replay {run_id} of {report.get('source_run_id')} ({report.get('mode')}): "
        f"{verdict(report)}",
        "  " + ", ".join(f"{name} {counts.get(name, 0)}" for name in OUTCOMES),
    ]
    for step in report.get("steps") or []:
        tokens = step.get("tokens_out")
        lines.append(
            f"  #{step.get('position')} {step.get('step_id') or '-'} "
            f"(recorded {step.get('recorded_step_id') or '-'}) "
            f"{step.get('outcome')}" + (f", {tokens} tokens" if tokens is not None else "")
        )
        if isinstance(step.get("divergence"), dict):
            lines.extend(render_divergence(step["divergence"]))
        if isinstance(step.get("miss"), dict):
            lines.extend(render_miss(step["miss"]))
    return "\n".join(lines) + "\n"


def render_error(exc: ClientError, doing: str) -> str:
    """An error for stderr: what failed, the server's code and message, and its details."""
    lines = [f"orchctl: {doing}: {exc.code}: {exc.message}"]
    if isinstance(exc, ApiError):
        for mismatch in exc.details.get("mismatches") or []:
            if not isinstance(mismatch, dict):
                continue
            lines.append(render_mismatch(mismatch))
        for error in exc.details.get("errors") or []:
            if isinstance(error, dict) and str(error.get("message")) not in exc.message:
                lines.append(f"  {error.get('field')}: {error.get('message')}")
        if exc.correlation_id:
            lines.append(f"  (HTTP {exc.status}, correlation id {exc.correlation_id})")
    return "\n".join(lines) + "\n"


def render_mismatch(mismatch: JsonObject) -> str:
    """``mismatch engine_version on sim/r0: recorded "1", current "2"`` (+ any other fields)."""
    known = ("input", "recorded", "current", "pool_id", "replica_id", "message")
    line = f"  mismatch {mismatch.get('input')}"
    if mismatch.get("pool_id") or mismatch.get("replica_id"):
        line += f" on {mismatch.get('pool_id')}/{mismatch.get('replica_id')}"
    line += (
        f": recorded {_value(mismatch.get('recorded'))}, current {_value(mismatch.get('current'))}"
    )
    extra = {k: v for k, v in mismatch.items() if k not in known}
    if extra:
        line += f" {json.dumps(extra, ensure_ascii=False, sort_keys=True)}"
    if mismatch.get("message"):
        line += f" ({mismatch['message']})"
    return line


def render_progress(step: StepReplay) -> str:
    return (
        f"  #{step.position} {step.step_id or '-'} (recorded {step.recorded_step_id}) "
        f"{step.tokens} tokens, {step.outcome}\n"
    )


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


# --- commands -------------------------------------------------------------------------------


class Io:
    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self.out, self.err = stdout, stderr


def _fail(io: Io, args: argparse.Namespace, exc: ClientError, doing: str) -> int:
    io.err.write(render_error(exc, doing))
    if getattr(args, "json", False):
        body = exc.body if isinstance(exc, ApiError) else {"code": exc.code, "message": exc.message}
        io.out.write(_dump({"error": body}))
    return EXIT_ERROR


def _print_report(io: Io, args: argparse.Namespace, report: JsonObject, replay_id: str) -> int:
    if args.json:
        io.out.write(_dump({**report, "replay_run_id": replay_id}))
    else:
        io.out.write(render_report(report, replay_id))
    return exit_code(report)


def cmd_replay(client: Client, args: argparse.Namespace, io: Io) -> int:
    mode = "strict_replay" if args.strict else "replay"

    def progress(step: StepReplay) -> None:
        if not args.json:
            io.err.write(render_progress(step))
            io.err.flush()

    try:
        replay_id, report = replay_run(client, args.run_id, strict=args.strict, on_step=progress)
    except ClientError as exc:
        return _fail(io, args, exc, f"{mode} of {args.run_id}")
    return _print_report(io, args, report, replay_id)


def cmd_report(client: Client, args: argparse.Namespace, io: Io) -> int:
    try:
        report = client.replay_report(args.run_id)
    except ClientError as exc:
        return _fail(io, args, exc, f"replay report of {args.run_id}")
    return _print_report(io, args, report, args.run_id)


def cmd_export(client: Client, args: argparse.Namespace, io: Io) -> int:
    try:
        bundle = client.export_run(args.run_id)
    except ClientError as exc:
        return _fail(io, args, exc, f"export of {args.run_id}")
    if args.output in (None, "-"):
        io.out.write(_dump(bundle))
    else:
        Path(args.output).write_text(_dump(bundle), encoding="utf-8")
        io.err.write(f"orchctl: wrote {args.run_id} to {args.output}\n")
    return EXIT_OK


def cmd_import(client: Client, args: argparse.Namespace, io: Io) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        bundle = json.loads(text)
    except (OSError, ValueError) as exc:
        io.err.write(f"orchctl: cannot read a bundle from {args.file}: {exc}\n")
        return EXIT_ERROR
    if not isinstance(bundle, dict):
        io.err.write(f"orchctl: {args.file} is not a run bundle (a JSON object)\n")
        return EXIT_ERROR
    try:
        run = client.import_run(bundle)
    except ClientError as exc:
        return _fail(io, args, exc, f"import of {args.file}")
    io.out.write(_dump(run))
    return EXIT_OK


# --- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # --url and --timeout are accepted before or after the command
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"server base URL (default: $ORCHCTL_URL or {DEFAULT_URL})",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="longest wait for the server, also between two events of a stream (default: 30)",
    )
    parser = argparse.ArgumentParser(
        prog="orchctl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"orchctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "replay",
        parents=[common],
        help="replay a recorded run and report whether it reproduced",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Create a replay run of RUN_ID's flow with its recorded seed, re-submit the\n"
            "recorded steps in order (each one followed to its end before the next), then\n"
            "print the server's replay report. Progress goes to stderr, one line per step.\n\n"
            "exit status: 0 complete and identical; 1 diverged, missed, failed or not\n"
            "replayed; 2 the replay run was refused (e.g. STRICT_REPLAY_MISMATCH, each\n"
            "mismatch is printed), another server error, or the server is unreachable"
        ),
    )
    p.add_argument("run_id", metavar="RUN_ID", help="the recorded run")
    p.add_argument(
        "--strict",
        action="store_true",
        help="strict_replay: run the engine again and fail at the first token that differs; "
        "refused unless seed, engine, engine version, model hash, replica and policy match",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (the server's report plus replay_run_id) and no "
        'progress; on exit status 2 print {"error": <error body>}',
    )
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "report",
        parents=[common],
        help="print the replay report of an existing replay run",
        description="Print the replay report of RUN_ID (a replay or strict_replay run); "
        "same output and exit status as replay.",
    )
    p.add_argument("run_id", metavar="RUN_ID", help="the replay run")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "export",
        parents=[common],
        help="write a finished run's bundle (flow, run, steps, events, facts, checkpoints)",
        description="Write the export bundle of RUN_ID to FILE (default: stdout).",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "import",
        parents=[common],
        help="import a run bundle written by export",
        description="POST the bundle in FILE ('-' for stdin) and print the imported run.",
    )
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_import)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    args = build_parser().parse_args(argv)
    io = Io(stdout or sys.stdout, stderr or sys.stderr)
    url: str = getattr(args, "url", None) or os.environ.get("ORCHCTL_URL") or DEFAULT_URL
    timeout: float = getattr(args, "timeout", 30.0)
    try:
        api_key = os.environ.get("ORCHCTL_API_KEY") or None  # never a flag: argv is public
        with Client(url, timeout=timeout, api_key=api_key) as client:
            result: int = args.func(client, args, io)
    except KeyboardInterrupt:
        io.err.write("orchctl: interrupted\n")
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
