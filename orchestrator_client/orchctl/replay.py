"""``orchctl runs replay | report | export | import`` (also top-level: ``orchctl replay``).

Replay a recorded run and check that it reproduces token for token (for CI):

  orchctl --url http://127.0.0.1:8080 replay run_01J... --strict

Exit status: 0 the replay is complete and identical; 1 it diverged, missed a recorded step,
a step failed or was not replayed; 2 the replay could not start (the server refused the run:
the reason and each mismatch are printed), the server answered an error, or it could not be
reached.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from contracts.replay import ReplayReport
from orchestrator_client.client import Client
from orchestrator_client.orchctl.common import (
    EXIT_FAILED,
    EXIT_OK,
    Output,
    UsageError,
    add_command,
    dumps,
    json_value,
    read_object,
)
from orchestrator_client.replay import StepReplay, replay_run

JsonObject = dict[str, Any]
OUTCOMES = ("identical", "diverged", "missed", "failed", "pending", "not_replayed")


# --- verdicts and rendering -----------------------------------------------------------------


def verdict(report: ReplayReport) -> str:
    """One word for a replay report: IDENTICAL, DIVERGED, MISSED, FAILED or INCOMPLETE."""
    counts = report.counts
    if counts.diverged:
        return "DIVERGED"
    if counts.missed:
        return "MISSED"
    if counts.failed:
        return "FAILED"
    if report.diverged:  # the server's flag covers all three
        return "DIVERGED"
    if not report.complete:
        return "INCOMPLETE"
    return "IDENTICAL"


def exit_code(report: ReplayReport) -> int:
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
    return json_value(value)


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
    return json_value(value)


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
                f"{indent}  {item.get('input')}: recorded {json_value(item.get('recorded'))}, "
                f"submitted {json_value(item.get('submitted'))}"
            )
    known = ("differs", "message", "inputs", *MISS_SHOWN_ELSEWHERE)
    rest = {k: v for k, v in miss.items() if k not in known}
    if rest:
        lines.append(f"{indent}  {json.dumps(rest, ensure_ascii=False, sort_keys=True)}")
    return lines


def render_report(report: ReplayReport, replay_run_id: str | None = None) -> str:
    """The human-readable report: a verdict header, one line per step, divergences in full."""
    counts = report.counts.model_dump()
    run_id = replay_run_id or report.run_id
    lines = [
        f"replay {run_id} of {report.source_run_id} ({report.mode}): {verdict(report)}",
        "  " + ", ".join(f"{name} {counts.get(name, 0)}" for name in OUTCOMES),
    ]
    for step in report.steps:
        lines.append(
            f"  #{step.position} {step.step_id or '-'} "
            f"(recorded {step.recorded_step_id or '-'}) "
            f"{step.outcome}, {step.tokens_out} tokens"
        )
        if step.divergence is not None:
            lines.extend(render_divergence(step.divergence.model_dump(mode="json")))
        if step.miss is not None:
            lines.extend(render_miss(step.miss))
    return "\n".join(lines) + "\n"


def render_progress(step: StepReplay) -> str:
    return (
        f"  #{step.position} {step.step_id or '-'} (recorded {step.recorded_step_id}) "
        f"{step.tokens} tokens, {step.outcome}\n"
    )


# --- commands -------------------------------------------------------------------------------


def _print_report(out: Output, report: ReplayReport, replay_id: str) -> int:
    if out.json:
        out.document({**report.model_dump(mode="json"), "replay_run_id": replay_id})
    else:
        out.stdout.write(render_report(report, replay_id))
    return exit_code(report)


def cmd_replay(client: Client, args: argparse.Namespace, out: Output) -> int:
    def progress(step: StepReplay) -> None:
        if not out.json:
            out.stderr.write(render_progress(step))
            out.stderr.flush()

    replay_id, report = replay_run(client, args.run_id, strict=args.strict, on_step=progress)
    return _print_report(out, report, replay_id)


def cmd_report(client: Client, args: argparse.Namespace, out: Output) -> int:
    return _print_report(out, client.replay_report(args.run_id), args.run_id)


def cmd_export(client: Client, args: argparse.Namespace, out: Output) -> int:
    bundle = client.export_run(args.run_id)
    text = dumps(bundle)
    if args.output in (None, "-"):
        out.stdout.write(text)
    else:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc}") from exc
        out.note(f"orchctl: wrote {args.run_id} to {args.output}")
    return EXIT_OK


def cmd_import(client: Client, args: argparse.Namespace, out: Output) -> int:
    bundle = read_object(args.file, out.stdin, "a run bundle")
    out.document(client.import_run(bundle))
    return EXIT_OK


def _mode(args: argparse.Namespace) -> str:
    return f"{'strict_replay' if args.strict else 'replay'} of {args.run_id}"


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    *,
    alias: bool = False,
) -> None:
    """The four commands, under ``runs`` or (``alias``) at the top, as scripts call them."""
    also = " (alias of runs {})" if alias else ""
    p = add_command(
        sub,
        "replay",
        cmd_replay,
        common=common,
        help="replay a recorded run and report whether it reproduced" + also.format("replay"),
        doing=_mode,
        description=(
            "Create a replay run of RUN_ID's flow with its recorded seed, re-submit the\n"
            "recorded steps in order (each one followed to its end before the next), then\n"
            "print the server's replay report. Progress goes to stderr, one line per step.\n\n"
            "exit status: 0 complete and identical; 1 diverged, missed, failed or not\n"
            "replayed; 2 the replay run was refused (e.g. STRICT_REPLAY_MISMATCH, each\n"
            "mismatch is printed), another server error, or the server is unreachable"
        ),
        json_help="print the report as JSON (the server's report plus replay_run_id) and no "
        'progress; on exit status 2 print {"error": <error body>}',
    )
    p.add_argument("run_id", metavar="RUN_ID", help="the recorded run")
    p.add_argument(
        "--strict",
        action="store_true",
        help="strict_replay: run the engine again and fail at the first token that differs; "
        "refused unless seed, engine, engine version, model hash, replica and policy match",
    )

    p = add_command(
        sub,
        "report",
        cmd_report,
        common=common,
        help="print the replay report of an existing replay run" + also.format("report"),
        doing="replay report of {run_id}",
        description="Print the replay report of RUN_ID (a replay or strict_replay run); "
        "same output and exit status as replay.",
        json_help="print the report as JSON",
    )
    p.add_argument("run_id", metavar="RUN_ID", help="the replay run")

    p = add_command(
        sub,
        "export",
        cmd_export,
        common=common,
        help="write a finished run's bundle (flow, run, steps, events, facts, checkpoints)"
        + also.format("export"),
        doing="export of {run_id}",
        description="Write the export bundle of RUN_ID (JSON) to FILE (default: stdout).",
        json_help="accepted for symmetry: the bundle is JSON either way",
        ids=("run_id",),
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")

    p = add_command(
        sub,
        "import",
        cmd_import,
        common=common,
        help="import a run bundle written by export" + also.format("import"),
        doing="import of {file}",
        description="POST the bundle in FILE ('-' for stdin) and print the imported run "
        "(JSON). Importing the same bundle again answers the same run.",
        json_help="accepted for symmetry: the run is printed as JSON either way",
    )
    p.add_argument("file", metavar="FILE")
