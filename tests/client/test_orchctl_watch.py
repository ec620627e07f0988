"""``orchctl runs watch`` in a real terminal: the live view runs in a tmux pane (120x40)
against an orchestratord process whose simulated engine streams 20 tokens a second, and the
test reads the screen (``capture-pane``) as a person would: the step running with its text
streaming and its budget reserved, then, once the run is completed through the SDK, the
final state and the exit status.

tmux is required under ``CI=true`` (``apt-get install -y tmux``); elsewhere the test is
skipped without it. Every wait polls the screen with a deadline; none is a fixed sleep.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator_client import Client, steps
from orchestrator_client.orchctl.watch import bar
from tests.procs import orchestratord

DEADLINE_S = 120.0
MAX_TOKENS = 160  # 8 s at 20 tokens a second: time to see it running on a loaded machine


def _tmux() -> str:
    exe = shutil.which("tmux")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed; CI=true requires it (apt-get install -y tmux)")
        pytest.skip("tmux is not installed (apt-get install -y tmux) to run the live view in")
    return exe


class Pane:
    """One tmux session on a server of its own (``-L``: nobody else's sessions are seen or
    touched), read with ``capture-pane``."""

    def __init__(self, tmux: str, env: dict[str, str]) -> None:
        self.tmux = tmux
        self.socket = f"orchctl-test-{os.getpid()}-{time.monotonic_ns()}"
        self.env = env
        self.last = ""

    def tmux_run(self, *args: str) -> str:
        done = subprocess.run(
            [self.tmux, "-L", self.socket, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def start(self, command: str) -> None:
        self.tmux_run("new-session", "-d", "-s", "watch", "-x", "120", "-y", "40", command)

    def capture(self) -> str:
        self.last = self.tmux_run("capture-pane", "-p", "-t", "watch")
        return self.last

    def until(self, what: str, done: Callable[[str], bool]) -> str:
        """The first screen for which ``done`` holds, polled until the deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            screen = self.capture()
            if done(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what}:\n{screen}")
            time.sleep(0.1)

    def kill(self) -> None:
        """End the session and its server, and remove the socket the server leaves."""
        subprocess.run(
            [self.tmux, "-L", self.socket, "kill-server"],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=False,
        )
        folder = Path(self.env.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (folder / self.socket).unlink(missing_ok=True)


def step_row(screen: str, step_id: str) -> list[str] | None:
    """The cells of the step's row in the view's steps table."""
    for line in screen.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[1] == step_id:
            return cells
    return None


def shown_text(screen: str, step_id: str) -> str:
    """The step's text as the view shows it (its last lines), whitespace collapsed."""
    lines = screen.splitlines()
    head = next((i for i, line in enumerate(lines) if f"{step_id}:" in line), None)
    if head is None or not lines[head].startswith("text of step"):
        return ""
    text = []
    for line in lines[head + 1 :]:
        if not line.strip() or line.startswith(("latest facts", "server:", "run_end:")):
            break
        text.append(line)
    return " ".join(" ".join(text).split())


def budget_line(screen: str, label: str) -> str:
    return next(line for line in screen.splitlines() if line.strip().startswith(label))


def _running_with_text(step_id: str) -> Callable[[str], bool]:
    def done(screen: str) -> bool:
        cells = step_row(screen, step_id)
        return cells is not None and cells[3] == "running" and bool(shown_text(screen, step_id))

    return done


@pytest.mark.slow
def test_runs_watch_streams_a_step_live_then_shows_the_end(tmp_path: Path) -> None:
    tmux = _tmux()
    server_env = {
        "ORCHESTRATORD_SIM__TOKENS_PER_S": "20",
        "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
    }
    db = f"sqlite:///{tmp_path / 'orch.db'}"
    with (
        orchestratord(tmp_path, "--engine", "sim", "--database-url", db, env=server_env) as url,
        Client(url) as client,
    ):
        flow = client.create_flow({"ast": {"watch": 1}})
        run = client.create_run(flow.flow_id, {"seed": 3, "budgets": {"max_tokens_out": 1000}})
        watch = [sys.executable, "-m", "orchestrator_client.orchctl", "--url", url]
        watch += ["runs", "watch", run.run_id]
        # the pane's own size, not one inherited (pytest-xdist workers set COLUMNS=80,
        # which rich would take over the terminal's)
        inherited = ("ORCHCTL_", "TMUX", "COLUMNS", "LINES", "NO_COLOR")
        env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
        env |= {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm-256color"}
        pane = Pane(tmux, env)
        try:
            pane.start(f'{shlex.join(watch)}; echo "orchctl exit status $?"; sleep 600')
            pane.until("the run's view", lambda s: f"run {run.run_id} running" in s)

            step = steps.llm_call("Tell me about rivers.", max_tokens=MAX_TOKENS)
            step_id = client.submit_step(run.run_id, step).step_id
            running = pane.until("the step running with its text", _running_with_text(step_id))
            cells = step_row(running, step_id)
            assert cells is not None
            assert cells[2] == "llm_call"
            assert re.fullmatch(r"\w+/r\d+", cells[4]), cells  # pool/replica
            assert 0 < int(cells[5]) < MAX_TOKENS, cells  # tokens so far, still running
            streaming = shown_text(running, step_id)
            reserved = budget_line(running, "tokens out")
            assert "▒" in reserved, reserved  # what the running step holds
            assert f"+ {MAX_TOKENS} reserved of 1000" in reserved, reserved

            client.complete_run(run.run_id)  # the run ends after its last step
            final = pane.until("orchctl's exit", lambda s: "orchctl exit status" in s)
        finally:
            pane.kill()
        ended = client.get_step(step_id)

    assert "orchctl exit status 0" in final, final
    assert f"run {run.run_id} succeeded" in final
    assert "run_end: succeeded" in final
    cells = step_row(final, step_id)
    assert cells is not None and cells[3:] == ["succeeded", cells[4], str(MAX_TOKENS), "length"]
    spent = budget_line(final, "tokens out")
    assert f"{MAX_TOKENS} used + 0 reserved of 1000" in spent, spent
    assert "█" in spent and "▒" not in spent, spent
    assert ended.output is not None
    text = " ".join(str(ended.output["text"]).split())
    assert streaming in text, (streaming, text)  # what streamed is part of the output
    assert text.endswith(shown_text(final, step_id)), final  # the view ends where it did


def test_a_budget_bar_shows_used_then_reserved_of_the_limit() -> None:
    assert bar(0, 0, 100).plain == "░" * 30
    assert bar(50, 25, 100).plain == "█" * 15 + "▒" * 8 + "░" * 7
    assert bar(90, 40, 100).plain == "█" * 27 + "▒" * 3  # reserved past the limit: cut
    assert bar(150, 0, 100).plain == "█" * 30
    assert bar(10, 10, 100, ascii=True).plain == "###+++" + "." * 24
