"""The README's shell blocks, run as a new user runs them, against a real server."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.procs import orchestratord

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def blocks(after_heading: str) -> str:
    """The first ```bash block after ``after_heading``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(after_heading)
    found = re.search(r"```bash\n(.*?)```", text[start:], re.DOTALL)
    assert found is not None, f"no bash block after {after_heading!r}"
    return found.group(1)


def test_the_tour_and_the_replay_examples_run(tmp_path: Path) -> None:
    with orchestratord(tmp_path, "--engine", "sim") as url:
        port = url.rsplit(":", 1)[1]
        script = blocks("## A short tour") + blocks("## orchctl")
        script += blocks("## Record, replay, strict_replay")
        script = script.replace("localhost:8080", f"localhost:{port}")
        script = script.replace(".venv/bin/", f"{ROOT}/.venv/bin/")
        done = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", script],
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"exit {done.returncode}\n{err[-3000:]}\n{out[-3000:]}"
    assert "event: end" in out  # the step's stream ran to its end
    assert "event: run_end" in out  # the completed run's stream closed
    assert '"code"' not in out.split("event: run_end")[0]  # no error body in the tour
    # with -e, orchctl's exit status 0 (every step identical) is part of the returncode above
    assert (tmp_path / "run.json").exists()  # the export
    assert re.search(r"run run_\w+ succeeded: 1 steps", out)  # orchctl runs watch, to the end


def test_the_sdk_example_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index("## The Python SDK")
    found = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert found is not None, "no python block in the SDK section"
    assert len(found.group(1).strip().splitlines()) <= 14
    with orchestratord(tmp_path, "--engine", "sim") as url:
        program = found.group(1).replace("http://127.0.0.1:8080", url)
        done = subprocess.run(
            [str(ROOT / ".venv/bin/python"), "-c", program],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert re.match(r"succeeded \d+ \{'text': ", done.stdout.decode()), done.stdout
