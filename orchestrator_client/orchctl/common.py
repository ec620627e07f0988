"""What every orchctl command shares: exit codes, the options each command takes, where its
output goes (a table, or JSON with ``--json``), and reading JSON from files and arguments."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel
from rich.console import Console, RenderableType

from orchestrator_client.client import Client
from orchestrator_client.errors import ApiError, ClientError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a command killed by SIGPIPE

DEFAULT_URL = "http://127.0.0.1:8080"  # orchestratord serve's default host and port
DEFAULT_TIMEOUT_S = 30.0

EXIT_STATUS = """\
exit status:
  0    done; a followed step or a watched run succeeded; a replay is identical
  1    what was asked about failed: a followed step ended in error or was cancelled,
       a watched run failed or was cancelled, a replay diverged, missed or failed
  2    usage error, an error the server answered (its code on stderr), or no server
  130  interrupted (Ctrl-C)
  141  stdout was closed early (orchctl ... | head)"""

Handler = Callable[[Client, argparse.Namespace, "Output"], int]
Doing = str | Callable[[argparse.Namespace], str]
"""What a command does, for its error messages: a format of its arguments or a function."""


class UsageError(Exception):
    """A command line argparse accepted but that cannot be carried out (a file that is not
    JSON, two kinds of step at once): exit status 2, the message on stderr."""


# --- output ---------------------------------------------------------------------------------


def make_console(file: TextIO) -> Console:
    """A console on ``file``: colours only on a terminal and without ``$NO_COLOR`` (rich reads
    both); off a terminal, wide enough that no table row wraps (scripts read them by line).
    Markup and emoji codes are off: what is printed is data."""
    terminal = _isatty(file)
    return Console(
        file=file,
        markup=False,
        emoji=False,
        highlight=False,
        width=None if terminal else 4096,
    )


def _isatty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


def jsonable(value: Any) -> Any:
    """A model (or a list of models) as its JSON value (``model_dump(mode="json")``)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(jsonable(value), ensure_ascii=False, indent=2) + "\n"


def compact(value: Any) -> str:
    """One line of JSON (streams print one event per line)."""
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


class Output:
    """Where a command writes: ``stdout`` holds its answer (a table, or with ``json`` the
    model's JSON and nothing else), ``stderr`` progress and errors."""

    def __init__(self, stdout: TextIO, stderr: TextIO, stdin: TextIO, *, json: bool) -> None:
        self.stdout, self.stderr, self.stdin = stdout, stderr, stdin
        self.json = json
        self.console = make_console(stdout)

    @property
    def terminal(self) -> bool:
        """Whether stdout is a terminal (where a live view can redraw itself)."""
        return _isatty(self.stdout)

    def show(self, value: Any, render: Callable[[], RenderableType]) -> None:
        """The answer: ``value`` as JSON with ``--json``, else what ``render`` draws."""
        if self.json:
            self.document(value)
        elif self.console.is_terminal:  # a terminal, or $FORCE_COLOR: as rich draws it
            self.console.print(render())
        else:  # the same, less the padding that ends each row (scripts split on spaces)
            with self.console.capture() as captured:
                self.console.print(render())
            lines = captured.get().splitlines()
            self.stdout.write("".join(line.rstrip() + "\n" for line in lines))
            self.stdout.flush()

    def document(self, value: Any) -> None:
        self.stdout.write(dumps(value))
        self.stdout.flush()

    def note(self, text: str) -> None:
        """A line for the person at the terminal (stderr): never part of the answer."""
        self.stderr.write(text.rstrip("\n") + "\n")
        self.stderr.flush()


# --- errors ---------------------------------------------------------------------------------


def error_body(exc: ClientError) -> dict[str, Any]:
    """The contract's error body of ``exc`` (the server's own when it answered one)."""
    if isinstance(exc, ApiError):
        return exc.body
    return {
        "code": exc.code,
        "message": exc.message,
        "retriable": exc.retriable,
        "details": exc.details,
    }


def render_error(exc: ClientError, doing: str) -> str:
    """An error for stderr: what failed, the code and message, and the details a person
    needs (each refused field, each replay mismatch, the correlation id)."""
    lines = [f"orchctl: {doing}: {exc.code}: {exc.message}"]
    for mismatch in exc.details.get("mismatches") or []:
        if isinstance(mismatch, dict):
            lines.append(render_mismatch(mismatch))
    for error in exc.details.get("errors") or []:
        if isinstance(error, dict) and str(error.get("message")) not in exc.message:
            where = error.get("field") or error.get("pointer")
            lines.append(f"  {where}: {error.get('message')}")
    if isinstance(exc, ApiError) and exc.correlation_id:
        lines.append(f"  (HTTP {exc.status}, correlation id {exc.correlation_id})")
    return "\n".join(lines) + "\n"


def render_mismatch(mismatch: Mapping[str, Any]) -> str:
    """``mismatch engine_version on sim/r0: recorded "1", current "2"`` (+ any other fields)."""
    known = ("input", "recorded", "current", "pool_id", "replica_id", "message")
    line = f"  mismatch {mismatch.get('input')}"
    if mismatch.get("pool_id") or mismatch.get("replica_id"):
        line += f" on {mismatch.get('pool_id')}/{mismatch.get('replica_id')}"
    line += (
        f": recorded {json_value(mismatch.get('recorded'))}, "
        f"current {json_value(mismatch.get('current'))}"
    )
    extra = {k: v for k, v in mismatch.items() if k not in known}
    if extra:
        line += f" {json.dumps(extra, ensure_ascii=False, sort_keys=True)}"
    if mismatch.get("message"):
        line += f" ({mismatch['message']})"
    return line


def json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- reading input --------------------------------------------------------------------------


def read_text(source: str, stdin: TextIO) -> str:
    """The text of a file, or of stdin for ``-``."""
    if source == "-":
        return stdin.read()
    try:
        return Path(source).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {source}: {exc}") from exc


def read_document(source: str, stdin: TextIO, what: str) -> Any:
    """A JSON document from a file or stdin (``-``); a ``.yaml``/``.yml`` file is read as
    YAML (pools files are written so)."""
    text = read_text(source, stdin)
    if source.endswith((".yaml", ".yml")):
        import yaml  # only for these files: the rest of orchctl never needs it

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{source} is not {what} (YAML): {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not {what} (JSON): {exc}") from exc


def read_object(source: str, stdin: TextIO, what: str) -> dict[str, Any]:
    value = read_document(source, stdin, what)
    if not isinstance(value, dict):
        raise UsageError(f"{source} is not {what} (a JSON object)")
    return value


def json_arg(text: str, stdin: TextIO, what: str) -> Any:
    """An argument holding JSON: inline (``'{"a": 1}'``), ``@FILE``, or ``-`` for stdin."""
    if text == "-" or text.startswith("@"):
        return read_document(text.removeprefix("@") if text != "-" else "-", stdin, what)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what} is not JSON ({exc}): {text[:80]!r}") from exc


def json_object_arg(text: str, stdin: TextIO, what: str) -> dict[str, Any]:
    value = json_arg(text, stdin, what)
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object: {text[:80]!r}")
    return value


def key_values(pairs: Sequence[str] | None, what: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a mapping."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UsageError(f"{what} must be KEY=VALUE: {pair!r}")
        result[key] = value
    return result


# --- the parser -----------------------------------------------------------------------------


def common_options() -> argparse.ArgumentParser:
    """--url and --timeout, accepted before or after the command (SUPPRESS: an option given
    at either place is kept; a default would let the subcommand's overwrite the top's)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"server base URL (default: $ORCHCTL_URL, $ORCHESTRATOR_URL, else {DEFAULT_URL})",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"longest wait for the server, also between two events of a stream "
        f"(default: {DEFAULT_TIMEOUT_S:g})",
    )
    return common


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    *,
    common: argparse.ArgumentParser,
    help: str,
    doing: Doing,
    description: str | None = None,
    json_help: str = "print the answer as JSON (the model's fields) and nothing else",
    ids: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """A leaf command: its handler, its ``--json`` flag, the common options and the exit
    status in its ``--help``; ``ids`` are its first positional arguments (``run_id`` is
    given as ``RUN_ID``)."""
    parser = sub.add_parser(
        name,
        parents=[common],
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name in ids:
        parser.add_argument(name, metavar=name.upper())
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(handler=handler, doing=doing)
    return parser


def add_noun(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    common: argparse.ArgumentParser,
    help: str,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """A noun (``runs``) whose verbs are its subcommands."""
    parser = sub.add_parser(
        name,
        parents=[common],
        help=help,
        description=help[:1].upper() + help[1:] + ".",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.add_subparsers(dest="verb", required=True, metavar="VERB")


def add_client_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--client-token",
        metavar="TOKEN",
        help="the write's retry token (default: a new one; the SDK's retries send the same): "
        "give the same TOKEN to repeat the command safely, the server answers the first write",
    )


def doing_text(args: argparse.Namespace) -> str:
    doing: Doing = getattr(args, "doing", "request")
    if callable(doing):
        return doing(args)
    return doing.format_map(vars(args))
