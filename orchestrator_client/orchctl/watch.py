"""``orchctl runs watch RUN_ID``: follow a run's stream to its ``run_end``.

On a terminal it is a live view (``rich.live``): each step with its type, status, pool and
tokens so far, the text of the step streaming now, budget bars (tokens used, reserved by
steps still running, the limit; cost), the latest facts and what the server last said.
Elsewhere it prints one plain line per step start and end, fact and run end; with
``--json``, every event as one JSON object a line. The stream is the run's whole history
first, so watching an ended run shows how it went. Exit status: 0 the run succeeded, 1 it
failed or was cancelled.

Budget usage is not in the stream: the run is read again when a step starts or ends, and
at most once a second while tokens stream.
"""

from __future__ import annotations

import argparse
import contextlib
import textwrap
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from contracts.events import (
    CheckpointEvent,
    EndEvent,
    ErrorEvent,
    EscalationEvent,
    EventBase,
    FactEvent,
    NarrationEvent,
    RunEndEvent,
    StartedEvent,
    TokenEvent,
    ToolSuggestEvent,
)
from contracts.runs import RunOut
from orchestrator_client.client import Client
from orchestrator_client.errors import ClientError
from orchestrator_client.orchctl.common import (
    EXIT_FAILED,
    EXIT_OK,
    Output,
    add_command,
    compact,
)
from orchestrator_client.orchctl.render import cell, money

REFRESH_S = 1.0
"""Least time between two reads of the run while tokens stream."""
STEPS_SHOWN = 12
FACTS_SHOWN = 5
TEXT_LINES = 6
BAR_WIDTH = 30


@dataclass
class StepView:
    """One step as its events tell it."""

    step_id: str
    position: int | None = None
    type: str = "?"
    status: str = "queued"
    pool: str | None = None
    tokens: int = 0
    text: str = ""
    detail: str | None = None
    """How it ended (stop reason, error code) or its last notable event."""


@dataclass
class RunView:
    """The run as its stream and its record tell it; ``apply`` takes each event."""

    run: RunOut
    steps: dict[str, StepView] = field(default_factory=dict)
    facts: deque[FactEvent] = field(default_factory=lambda: deque(maxlen=FACTS_SHOWN))
    narration: str | None = None
    ended: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, step_id: str) -> StepView:
        if step_id not in self.steps:
            self.steps[step_id] = StepView(step_id)
        return self.steps[step_id]

    def apply(self, event: EventBase) -> None:
        with self.lock:
            self._apply(event)

    def _apply(self, event: EventBase) -> None:
        if isinstance(event, RunEndEvent):
            self.ended = event.status
            return
        if isinstance(event, FactEvent):
            self.facts.append(event)
        if isinstance(event, NarrationEvent):
            self.narration = event.text
        if event.step_id is None:
            return
        step = self.step(event.step_id)
        if isinstance(event, StartedEvent):
            step.status = "running"
            where = event.pool_id and f"{event.pool_id}/{event.replica_id or '-'}"
            step.pool = where or event.tool or event.engine
        elif isinstance(event, TokenEvent):
            step.tokens = max(step.tokens, event.i + 1)
            step.text += event.t
        elif isinstance(event, EndEvent):
            step.status = "cancelled" if event.stop_reason == "cancelled" else "succeeded"
            step.tokens = max(step.tokens, event.tokens_out)
            step.detail = event.stop_reason
        elif isinstance(event, ErrorEvent):
            step.status = "failed"
            step.detail = event.code
        elif isinstance(event, ToolSuggestEvent):
            step.detail = f"suggests {event.tool}"
        elif isinstance(event, CheckpointEvent):
            step.detail = f"checkpoint {event.checkpoint_id}"
        elif isinstance(event, EscalationEvent):
            step.detail = f"breaker {event.state}: {event.target}"

    def set_run(self, run: RunOut) -> None:
        with self.lock:
            self.run = run

    def ordered(self) -> list[StepView]:
        known = list(self.steps.values())
        return sorted(known, key=lambda s: (s.position is None, s.position or 0))

    def exit_status(self) -> int:
        return EXIT_OK if self.ended == "succeeded" else EXIT_FAILED

    # --- the live view

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        with self.lock:
            yield Group(*self._parts(options.max_width, ascii=_ascii(console)))

    def _parts(self, width: int, *, ascii: bool) -> Iterator[Any]:
        run = self.run
        status = self.ended or run.status
        head = Text()
        head.append(f"run {run.run_id} ", style="bold")
        head.append(status, style=_STATUS_STYLE.get(status, ""))
        head.append(f"  mode {run.mode}  seed {run.seed}  steps {len(self.steps)}  ")
        head.append(f"flow {run.flow_id[:21]}…", style="dim")
        yield head
        yield _budgets(run, ascii=ascii)
        yield self._steps_table()
        streaming = self._streaming()
        if streaming is not None:
            yield Text(f"text of step #{_pos(streaming)} {streaming.step_id}:", style="bold")
            yield Text(_tail(streaming.text, max(20, width - 2), TEXT_LINES), style="cyan")
        if self.facts:
            yield _facts_table(self.facts)
        if self.narration:
            yield Text(f"server: {self.narration}", style="dim")
        if self.ended:
            yield Text(f"run_end: {self.ended}", style=_STATUS_STYLE.get(self.ended, "bold"))

    def _steps_table(self) -> Table:
        table = Table(title="steps", title_justify="left", box=None, pad_edge=False)
        for name in ("#", "STEP", "TYPE", "STATUS", "POOL", "TOKENS"):
            table.add_column(name, no_wrap=True)
        table.add_column("END", no_wrap=True, overflow="ellipsis")
        steps = self.ordered()
        hidden = len(steps) - STEPS_SHOWN
        if hidden > 0:
            table.caption = f"{hidden} earlier steps not shown"
        for step in steps[-STEPS_SHOWN:]:
            table.add_row(
                _pos(step),
                step.step_id,
                step.type,
                Text(step.status, style=_STATUS_STYLE.get(step.status, "")),
                cell(step.pool),
                str(step.tokens),
                cell(step.detail),
            )
        return table

    def _streaming(self) -> StepView | None:
        """The step whose text is shown whole: the last running one, else the last with text."""
        with_text = [s for s in self.ordered() if s.text]
        running = [s for s in with_text if s.status == "running"]
        shown = running or with_text
        return shown[-1] if shown else None


_STATUS_STYLE = {
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "cancelling": "magenta",
}


def _ascii(console: Console) -> bool:
    return not (console.encoding or "").lower().startswith("utf")


def _pos(step: StepView) -> str:
    return "?" if step.position is None else str(step.position)


def _tail(text: str, width: int, lines: int) -> str:
    """The last ``lines`` lines of ``text`` wrapped at ``width``."""
    wrapped: list[str] = []
    for paragraph in text.split("\n"):
        wrapped.extend(textwrap.wrap(paragraph, width, replace_whitespace=False) or [""])
    return "\n".join(wrapped[-lines:])


def bar(used: float, reserved: float, limit: float, *, ascii: bool = False) -> Text:
    """``used`` then ``reserved`` out of ``limit``, ``BAR_WIDTH`` cells wide."""
    full, held, free = ("#", "+", ".") if ascii else ("█", "▒", "░")
    cells_used = min(BAR_WIDTH, round(BAR_WIDTH * used / limit)) if limit > 0 else BAR_WIDTH
    cells_held = min(BAR_WIDTH - cells_used, round(BAR_WIDTH * reserved / limit)) if limit else 0
    text = Text()
    text.append(full * cells_used, style="green" if used <= limit else "red")
    text.append(held * cells_held, style="yellow")
    text.append(free * (BAR_WIDTH - cells_used - cells_held), style="dim")
    return text


def _budgets(run: RunOut, *, ascii: bool) -> Table:
    table = Table(title="budgets", title_justify="left", box=None, show_header=False)
    table.add_column("budget", no_wrap=True)
    table.add_column("bar", no_wrap=True)
    table.add_column("numbers", no_wrap=True)
    limits = run.budgets
    for label, key, used, held in (
        ("tokens in", "max_tokens_in", run.usage.tokens_in, run.reserved.tokens_in),
        ("tokens out", "max_tokens_out", run.usage.tokens_out, run.reserved.tokens_out),
    ):
        limit = limits.get(key)
        numbers = f"{used} used + {held} reserved"
        if isinstance(limit, int | float):
            table.add_row(label, bar(used, held, limit, ascii=ascii), f"{numbers} of {limit}")
        else:
            table.add_row(label, Text("no limit", style="dim"), numbers)
    cost = run.usage.cost_usd
    spent = run.usage.priced_cost_usd if cost is None else cost
    numbers = f"{money(spent)} used + {money(run.reserved.cost_usd)} reserved"
    if run.usage.unpriced_steps:
        numbers += f" ({run.usage.unpriced_steps} steps unpriced)"
    limit = limits.get("max_cost_usd")
    if isinstance(limit, int | float):
        reserved = run.reserved.cost_usd or 0.0
        table.add_row(
            "cost", bar(spent, reserved, limit, ascii=ascii), f"{numbers} of {money(limit)}"
        )
    else:
        table.add_row("cost", Text("no limit", style="dim"), numbers)
    return table


def _facts_table(facts: deque[FactEvent]) -> Table:
    table = Table(title="latest facts", title_justify="left", box=None, pad_edge=False)
    table.add_column("TYPE", no_wrap=True)
    table.add_column("STEP", no_wrap=True)
    table.add_column("DATA", no_wrap=True, overflow="ellipsis")
    for fact in facts:
        table.add_row(fact.fact_type, cell(fact.emitted_by_step), compact(fact.data))
    return table


# --- following ------------------------------------------------------------------------------


class Watcher:
    """Reads the run's stream into a :class:`RunView`, reading the run and its steps'
    records as the view needs them."""

    def __init__(self, client: Client, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.view = RunView(client.get_run(run_id))
        self._read_at = time.monotonic()
        for step in client.list_steps(run_id):
            self._know(step.step_id, step.position, step.type)

    def _know(self, step_id: str, position: int, kind: str) -> None:
        with self.view.lock:
            view = self.view.step(step_id)
            view.position, view.type = position, kind

    def events(self) -> Iterator[EventBase]:
        """Each event, applied to the view before it is yielded."""
        for event in self.client.stream_run(self.run_id):
            if event.step_id is not None and event.step_id not in self.view.steps:
                self._learn(event.step_id)
            self.view.apply(event)
            self._refresh(
                force=isinstance(event, StartedEvent | EndEvent | ErrorEvent | RunEndEvent)
            )
            yield event

    def _learn(self, step_id: str) -> None:
        try:
            step = self.client.get_step(step_id)
        except ClientError:
            return  # the view shows it without its type
        self._know(step_id, step.position, step.type)

    def _refresh(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < REFRESH_S:
            return
        self._read_at = now
        with contextlib.suppress(ClientError):  # the stream goes on; budgets show the last read
            self.view.set_run(self.client.get_run(self.run_id))


def plain_line(view: RunView, event: EventBase) -> str | None:
    """A line for a log: step starts and ends, suggestions, facts, checkpoints, the end."""
    if isinstance(event, RunEndEvent):
        usage = view.run.usage
        return (
            f"run {event.run_id} {event.status}: {len(view.steps)} steps, "
            f"{usage.tokens_in} tokens in, {usage.tokens_out} out, cost {money(usage.cost_usd)}"
        )
    if isinstance(event, FactEvent):
        return f"fact {event.fact_type} {compact(event.data)}"
    if event.step_id is None:
        return None
    step = view.steps[event.step_id]
    name = f"step #{_pos(step)} {step.step_id} {step.type}"
    if isinstance(event, StartedEvent):
        return f"{name} started on {step.pool or '-'}"
    if isinstance(event, EndEvent):
        text = f" text {compact(step.text)}" if step.text else ""
        return f"{name} {step.status} ({event.stop_reason}), {step.tokens} tokens{text}"
    if isinstance(event, ErrorEvent):
        return f"{name} failed: {event.code}: {event.message}"
    if isinstance(event, ToolSuggestEvent):
        return f"{name} suggests {event.tool} {compact(event.args)} (valid: {event.valid})"
    if isinstance(event, CheckpointEvent):
        return f"{name} checkpoint {event.checkpoint_id} {event.state_hash}"
    return None


def cmd_watch(client: Client, args: argparse.Namespace, out: Output) -> int:
    if out.json:  # the events as they are: no view, no reads of the run
        ended = None
        for event in client.stream_run(args.run_id):
            out.stdout.write(compact(event) + "\n")
            out.stdout.flush()
            if isinstance(event, RunEndEvent):
                ended = event.status
        return EXIT_OK if ended == "succeeded" else EXIT_FAILED
    watcher = Watcher(client, args.run_id)
    view = watcher.view
    if args.plain or not out.terminal:
        for event in watcher.events():
            line = plain_line(view, event)
            if line is not None:
                out.stdout.write(line + "\n")
                out.stdout.flush()
    else:
        with Live(view, console=out.console, refresh_per_second=8, transient=False):
            for _ in watcher.events():
                pass
        out.console.print(f"run {args.run_id} {view.ended}")
    return view.exit_status()


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = add_command(
        sub,
        "watch",
        cmd_watch,
        common=common,
        help="follow a run live to its end: steps, streaming text, budgets, facts",
        doing="watch of {run_id}",
        description="Follow RUN_ID's stream to its run_end. On a terminal: a live view of\n"
        "each step (type, status, pool, tokens so far), the text streaming now, budget bars\n"
        "(used, reserved by running steps, limit; cost) and the latest facts. Elsewhere (or\n"
        "with --plain): one line per step start and end, fact and the run's end. The\n"
        "stream starts at the run's beginning, so an ended run shows how it went.\n"
        "Exit 0 when the run succeeded, 1 when it failed or was cancelled.",
        json_help="print every event of the run's stream as one JSON object a line",
        ids=("run_id",),
    )
    p.add_argument(
        "--plain", action="store_true", help="plain lines even on a terminal (for a log)"
    )
