"""Every orchctl command against a real server on a loopback port: its table, its ``--json``
(the model's JSON, nothing else), its exit status, and its errors (an unknown id is exit 2
with the server's code on stderr). The replay commands are in ``test_orchctl.py``; the live
view of ``runs watch`` in a terminal is in ``test_orchctl_watch.py``.

The commands print what the SDK answers, the same on either database: these tests run on
SQLite only.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator_client.orchctl import main
from orchestrator_client.orchctl.common import make_console
from orchestratord.settings import Settings
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, sleeping_step, submit, wait_status
from tests.procs import free_port

FAKE_ENGINE = {
    "fake": {
        "command": "{python} -m test_harness.fake_openai_server --host {host} --port {port}",
        "model": "fake-model",
    }
}
ECHO = {
    "name": "echo",
    "description": "says its args back",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    "executor": {"kind": "builtin", "name": "echo"},
}


@pytest.fixture
def db_url(tmp_path: Path, sqlite_template: Path) -> str:
    """SQLite only (see the module's docstring): a copy of the migrated template."""
    target = tmp_path / "orch.db"
    shutil.copyfile(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The tests' settings, with a provisioner whose engine is the fake OpenAI server."""
    return make_settings(db_url, provision={"commands": FAKE_ENGINE}, health_interval_s=0.2)


@pytest.fixture(autouse=True)
def _no_forced_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the test machine's environment, stdout here is no terminal."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


async def orchctl(live: httpx.AsyncClient, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``orchctl --url <live> ARGV``, in a thread: the
    server runs in this event loop and the CLI blocks."""
    out, err = io.StringIO(), io.StringIO()
    run = functools.partial(main, stdout=out, stderr=err, stdin=io.StringIO(stdin))
    code = await asyncio.to_thread(run, ["--url", str(live.base_url), *argv])
    assert "\x1b[" not in out.getvalue(), "colours on a stdout that is no terminal"
    return code, out.getvalue(), err.getvalue()


async def as_json(live: httpx.AsyncClient, *argv: str, stdin: str = "") -> Any:
    """The JSON a command prints with ``--json``; it must exit 0 and say nothing else."""
    code, out, err = await orchctl(live, *argv, "--json", stdin=stdin)
    assert code == 0, out + err
    return json.loads(out)


def row(out: str, name: str) -> str:
    """The value of field ``name`` in a record table."""
    for line in out.splitlines():
        field, _, value = line.partition(" ")
        if field == name:
            return value.strip()
    raise AssertionError(f"no {name!r} row in:\n{out}")


def table(out: str) -> list[list[str]]:
    """The rows of a list table (cells split on runs of two or more spaces), header first."""
    lines = [line for line in out.splitlines() if line.strip() and not line.startswith("─")]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


async def api(live: httpx.AsyncClient, method: str, path: str, **kw: Any) -> Any:
    r = await live.request(method, path, **kw)
    assert r.status_code < 300, r.text
    return r.json()


# --- flows ----------------------------------------------------------------------------------


async def test_flows_create_from_a_file_or_stdin(live: httpx.AsyncClient, tmp_path: Path) -> None:
    flow = {"ast": {"program": "cli"}, "tools": [ECHO], "config": {"k": 1}}
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(flow))
    code, out, err = await orchctl(live, "flows", "create", str(path), "--label", "team=a")
    assert (code, err) == (0, "")
    flow_id = row(out, "flow_id")
    assert flow_id.startswith("flow_")
    assert row(out, "hash") == "sha256:" + flow_id.removeprefix("flow_")
    created = await as_json(live, "flows", "create", "-", stdin=json.dumps(flow))
    assert set(created) == {"flow_id", "hash", "created_at"}
    assert created["flow_id"] == flow_id  # the same content is the same flow

    code, out, err = await orchctl(live, "flows", "create", str(tmp_path / "none.json"))
    assert code == 2
    assert err.startswith(f"orchctl: cannot read {tmp_path / 'none.json'}")
    code, out, err = await orchctl(live, "flows", "create", "-", "--json", stdin="{nope")
    assert (code, out) == (2, "")
    assert err.startswith("orchctl: - is not a flow (JSON): ")
    code, out, err = await orchctl(live, "flows", "create", "-", stdin='{"tools": []}')
    assert code == 2
    assert err.startswith("orchctl: create of a flow from -: INVALID_PARAMS: ast: ")


async def test_flows_get_by_id_or_hash(live: httpx.AsyncClient) -> None:
    flow_id = await make_flow(live, {"program": "get"}, tools=[ECHO], labels={"team": "b"})
    code, out, _ = await orchctl(live, "flows", "get", flow_id)
    assert code == 0
    assert row(out, "tools") == "echo"
    assert row(out, "labels") == '{"team": "b"}'
    assert row(out, "ast") == '{"program": "get"}'
    got = await as_json(live, "flows", "get", flow_id)
    assert got == await api(live, "GET", f"/v1/flows/{flow_id}")
    by_hash = await as_json(live, "flows", "get", "--hash", got["hash"])
    assert by_hash["flow_id"] == flow_id
    code, _, err = await orchctl(live, "flows", "get")
    assert code == 2
    assert "FLOW_ID or --hash" in err


# --- runs -----------------------------------------------------------------------------------


async def test_runs_create_from_flags_and_a_body(live: httpx.AsyncClient, tmp_path: Path) -> None:
    flow_id = await make_flow(live, {"program": "runs"})
    (pool,) = await api(live, "GET", "/v1/pools")
    argv = ["runs", "create", flow_id, "--seed", "9", "--max-tokens-out", "50"]
    argv += ["--max-cost-usd", "0.5", "--pin", pool["pool_id"], "--client-token", "once"]
    run = await as_json(live, *argv)
    assert (run["seed"], run["mode"], run["status"]) == (9, "record", "running")
    assert run["budgets"]["max_tokens_out"] == 50
    assert run["budgets"]["max_cost_usd"] == 0.5
    assert run["pool_policy"] == {"pin": pool["pool_id"]}
    again = await as_json(live, *argv)  # the same token: the first run, not another
    assert again["run_id"] == run["run_id"]

    body = tmp_path / "run.json"
    body.write_text(json.dumps({"seed": 3, "budgets": {"max_wall_ms": 1000}}))
    code, out, err = await orchctl(
        live, "runs", "create", flow_id, "--body", str(body), "--max-tokens-in", "5"
    )
    assert code == 0, err
    assert row(out, "seed") == "3"
    assert row(out, "budgets") == "tokens_in 5, wall_ms 1000"
    assert row(out, "status") == "running"

    code, _, err = await orchctl(live, "runs", "create", flow_id, "--mode", "replay")
    assert code == 2
    assert "--mode replay needs --source-run-id" in err
    code, _, err = await orchctl(live, "runs", "create", "flow_nope")
    assert code == 2
    assert "NOT_FOUND" in err


async def test_runs_list_newest_first_with_filters(live: httpx.AsyncClient) -> None:
    flow_a = await make_flow(live, {"program": "a"})
    flow_b = await make_flow(live, {"program": "b"})
    runs_a = [await make_run(live, flow_a) for _ in range(3)]
    await make_run(live, flow_b)
    await api(live, "POST", f"/v1/runs/{runs_a[0]}/complete", json={"status": "succeeded"})

    listed = await as_json(live, "runs", "list", "--flow", flow_a)
    assert [r["run_id"] for r in listed] == runs_a[::-1]
    page = await as_json(
        live, "runs", "list", "--flow", flow_a, "--limit", "1", "--after", runs_a[2]
    )
    assert [r["run_id"] for r in page] == [runs_a[1]]
    done = await as_json(live, "runs", "list", "--flow", flow_a, "--status", "succeeded")
    assert [r["run_id"] for r in done] == [runs_a[0]]

    code, out, _ = await orchctl(live, "runs", "list", "--flow", flow_a)
    assert code == 0
    rows = table(out)
    assert rows[0][:4] == ["RUN", "STATUS", "MODE", "STEPS"]
    assert [r[0] for r in rows[1:]] == runs_a[::-1]
    assert rows[-1][1:3] == ["succeeded", "record"]
    code, out, _ = await orchctl(live, "runs", "list", "--flow", "flow_none")
    assert (code, table(out)[-1]) == (0, ["no runs"])


async def test_runs_get(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live, seed=4, budgets={"max_tokens_out": 40})
    r = await submit(live, run_id, max_tokens=5)
    await wait_status(live, r.json()["step_id"], "succeeded")
    code, out, _ = await orchctl(live, "runs", "get", run_id)
    assert code == 0
    assert (row(out, "run_id"), row(out, "status"), row(out, "seed")) == (run_id, "running", "4")
    assert row(out, "budgets") == "tokens_out 40"
    assert row(out, "usage").startswith("in 1, out 5, cost ")
    assert await as_json(live, "runs", "get", run_id) == await api(
        live, "GET", f"/v1/runs/{run_id}"
    )


async def test_runs_complete(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    ended = await as_json(
        live, "runs", "complete", run_id, "--status", "failed", "--output", '{"why": "x"}'
    )
    assert (ended["status"], ended["output"]) == ("failed", {"why": "x"})
    run_id = await make_run(live)
    code, out, _ = await orchctl(live, "runs", "complete", run_id)
    assert (code, row(out, "status")) == (0, "succeeded")
    code, _, err = await orchctl(live, "runs", "complete", run_id, "--output", "[1]")
    assert code == 2
    assert "--output must be a JSON object" in err


async def test_runs_cancel(live: httpx.AsyncClient) -> None:
    run_id, step_id = await sleeping_step(live)
    answer = await as_json(live, "runs", "cancel", run_id)
    assert answer["status"] in ("cancelling", "cancelled")
    await wait_status(live, step_id, "cancelled")
    code, out, _ = await orchctl(live, "runs", "cancel", run_id)  # safe to repeat
    assert (code, row(out, "run_id"), row(out, "status")) == (0, run_id, "cancelled")


async def test_runs_fork_from_a_checkpoint(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live, seed=5)
    await api(live, "POST", f"/v1/runs/{run_id}/facts", json={"type": "a", "data": 1})
    made = await api(live, "POST", f"/v1/runs/{run_id}/checkpoint", json={"state": {"t": 1}})
    argv = ["runs", "fork", run_id, made["checkpoint_id"], "--client-token", "f1"]
    forked = await as_json(live, *argv)
    assert forked["forked_from"] == {"run_id": run_id, "checkpoint_id": made["checkpoint_id"]}
    assert (forked["mode"], forked["seed"]) == ("record", 5)
    assert (await as_json(live, *argv))["run_id"] == forked["run_id"]
    facts = await as_json(live, "facts", "list", forked["run_id"])
    assert [f["type"] for f in facts] == ["a"]
    code, _, err = await orchctl(live, "runs", "fork", run_id, "ckpt_nope")
    assert code == 2
    assert err.startswith(f"orchctl: fork of run {run_id} at ckpt_nope: ")


async def _ended_run(live: httpx.AsyncClient) -> tuple[str, str]:
    """A completed run: an llm_call of 4 tokens, an echo tool call, a posted fact."""
    run_id = await make_run(live, await make_flow(live, {"program": "w"}, tools=[ECHO]))
    llm = (await submit(live, run_id, max_tokens=4)).json()["step_id"]
    await wait_status(live, llm, "succeeded")
    tool = {"type": "tool_call", "client_token": "t", "input": {"tool": "echo", "args": {}}}
    echo = (await api(live, "POST", f"/v1/runs/{run_id}/steps", json=tool))["step_id"]
    await wait_status(live, echo, "succeeded")
    await api(live, "POST", f"/v1/runs/{run_id}/facts", json={"type": "note", "data": {"n": 1}})
    await api(live, "POST", f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    return run_id, llm


async def test_runs_watch_prints_lines_off_a_terminal(live: httpx.AsyncClient) -> None:
    run_id, llm = await _ended_run(live)
    text = (await api(live, "GET", f"/v1/steps/{llm}"))["output"]["text"]
    code, out, err = await orchctl(live, "runs", "watch", run_id)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"step #0 {llm} llm_call started on ")
    assert (
        lines[1] == f"step #0 {llm} llm_call succeeded (length), 4 tokens text {json.dumps(text)}"
    )
    assert re.fullmatch(r"step #1 step_\w+ tool_call started on echo", lines[2])
    assert lines[3] == 'fact tool_result {"tool":"echo","args":{},"result":{}}'
    assert re.fullmatch(r"step #1 step_\w+ tool_call succeeded \(eos\), 0 tokens", lines[4])
    assert lines[5] == 'fact note {"n":1}'
    assert lines[6].startswith(f"run {run_id} succeeded: 2 steps, ")
    assert len(lines) == 7

    events = [
        json.loads(line)
        for line in (await orchctl(live, "runs", "watch", run_id, "--json"))[1].splitlines()
    ]
    assert events[0]["type"] == "started"
    assert events[-1] == {
        "step_id": None,
        "seq": None,
        "type": "run_end",
        "run_id": run_id,
        "status": "succeeded",
    }
    tokens = [e["t"] for e in events if e["type"] == "token"]
    assert "".join(tokens) == text


async def test_runs_watch_of_a_cancelled_run_exits_1(live: httpx.AsyncClient) -> None:
    run_id, step_id = await sleeping_step(live)
    await api(live, "POST", f"/v1/runs/{run_id}/cancel")
    code, out, _ = await orchctl(live, "runs", "watch", run_id, "--plain")
    assert code == 1
    assert f"step #0 {step_id} tool_call cancelled (cancelled), 0 tokens" in out
    assert out.splitlines()[-1].startswith(f"run {run_id} cancelled: 1 steps")


# --- steps ----------------------------------------------------------------------------------


async def test_steps_submit_shorthands_and_files(live: httpx.AsyncClient, tmp_path: Path) -> None:
    run_id = await make_run(live, await make_flow(live, {"program": "s"}, tools=[ECHO]))
    accepted = await as_json(
        live, "steps", "submit", run_id, "--llm-call", "hi", "--max-tokens", "3"
    )
    assert set(accepted) == {"step_id", "status"}
    step = await wait_status(live, accepted["step_id"], "succeeded")
    assert (step["type"], step["input"]["prompt"], step["usage"]["tokens_out"]) == (
        "llm_call",
        "hi",
        3,
    )

    code, out, err = await orchctl(
        live, "steps", "submit", run_id, "--tool", "echo", "--args", '{"text": "yo"}', "--follow"
    )
    assert code == 0, err
    assert json.loads(out) == {"result": {"text": "yo"}, "stop_reason": "eos"}
    assert err.splitlines()[-1].endswith("end (eos), 0 tokens in, 0 out")
    code, out, err = await orchctl(
        live, "steps", "submit", run_id, "--gate", "size(facts) >= 1", "-f"
    )
    assert code == 0, err
    assert json.loads(out)["result"] is True  # the echo call's tool_result is a fact

    path = tmp_path / "step.json"
    path.write_text(json.dumps({"type": "llm_call", "input": {"prompt": "file"}}))
    argv = ["steps", "submit", run_id, str(path), "--client-token", "same"]
    first = await as_json(live, *argv)
    assert (await as_json(live, *argv))["step_id"] == first["step_id"]  # a safe repeat
    piped = await as_json(live, "steps", "submit", run_id, "-", stdin=path.read_text())
    assert piped["step_id"] != first["step_id"]  # a new token each time

    code, out, err = await orchctl(live, "steps", "submit", run_id)
    assert (code, out) == (2, "")
    assert "steps submit takes one step" in err
    code, _, err = await orchctl(live, "steps", "submit", run_id, str(path), "--gate", "true")
    assert code == 2
    assert "(given: FILE, gate)" in err
    code, _, err = await orchctl(
        live, "steps", "submit", run_id, "--llm-call", "x", "--max-tokens", "0"
    )
    assert code == 2
    assert "INVALID_PARAMS" in err and "max_tokens" in err
    code, _, err = await orchctl(live, "steps", "submit", run_id, "--tool", "nope")
    assert code == 2
    assert "INVALID_PARAMS" in err and "input.tool" in err


async def test_steps_submit_follow_prints_the_tokens(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    code, out, err = await orchctl(
        live, "steps", "submit", run_id, "--llm-call", "hi", "--max-tokens", "5", "-f"
    )
    assert code == 0, err
    first, last = err.splitlines()[0], err.splitlines()[-1]
    step_id = first.split()[1]
    assert first == f"orchctl: {step_id} queued" or first == f"orchctl: {step_id} running"
    assert last == f"orchctl: {step_id} end (length), 1 tokens in, 5 out"
    step = await api(live, "GET", f"/v1/steps/{step_id}")
    assert out == step["output"]["text"] + "\n"

    code, out, err = await orchctl(
        live, "steps", "submit", run_id, "--llm-call", "hey", "--max-tokens", "2", "-f", "--json"
    )
    assert (code, err) == (0, "")
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events if e["type"] != "narration"] == [
        "started",
        "token",
        "token",
        "end",
    ]


async def test_steps_list_and_get(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    ids = []
    for i in range(2):
        ids.append((await submit(live, run_id, token=f"t{i}", max_tokens=2 + i)).json()["step_id"])
        await wait_status(live, ids[-1], "succeeded")
    listed = await as_json(live, "steps", "list", run_id)
    assert [s["step_id"] for s in listed] == ids
    code, out, _ = await orchctl(live, "steps", "list", run_id)
    rows = table(out)
    assert rows[0] == ["#", "STEP", "TYPE", "STATUS", "POOL", "TOKENS IN", "TOKENS OUT", "CREATED"]
    assert [r[:4] for r in rows[1:]] == [
        ["0", ids[0], "llm_call", "succeeded"],
        ["1", ids[1], "llm_call", "succeeded"],
    ]
    assert [r[6] for r in rows[1:]] == ["2", "3"]

    step = await as_json(live, "steps", "get", ids[1])
    assert step == await api(live, "GET", f"/v1/steps/{ids[1]}")
    code, out, _ = await orchctl(live, "steps", "get", ids[1])
    assert code == 0
    assert (row(out, "status"), row(out, "type"), row(out, "position")) == (
        "succeeded",
        "llm_call",
        "1",
    )
    assert row(out, "text") == step["output"]["text"].strip()
    assert row(out, "placement") == "auto"


async def test_steps_cancel_then_its_stream_exits_1(live: httpx.AsyncClient) -> None:
    _, step_id = await sleeping_step(live)
    answer = await as_json(live, "steps", "cancel", step_id)
    assert answer["status"] in ("cancelling", "cancelled")
    await wait_status(live, step_id, "cancelled")
    code, out, err = await orchctl(live, "steps", "stream", step_id)
    assert code == 1
    assert json.loads(out) == {"result": None, "stop_reason": "cancelled"}  # its output
    assert err.splitlines()[-1] == f"orchctl: {step_id} end (cancelled), 0 tokens in, 0 out"


async def test_steps_stream_text_json_and_resume(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=6)).json()["step_id"]
    step = await wait_status(live, step_id, "succeeded")
    code, out, err = await orchctl(live, "steps", "stream", step_id)
    assert code == 0
    assert out == step["output"]["text"] + "\n"
    assert err == f"orchctl: {step_id} end (length), 1 tokens in, 6 out\n"

    code, out, _ = await orchctl(live, "steps", "stream", step_id, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "end" and events[-1]["tokens_out"] == 6
    code, out, _ = await orchctl(live, "steps", "stream", step_id, "--json", "--after", "3")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [e["seq"] for e in events[4:]]


async def test_steps_stream_of_a_failed_step_exits_1(live: httpx.AsyncClient) -> None:
    down = {
        "name": "down",
        "description": "nobody listens",
        "parameters": {"type": "object"},
        "executor": {"kind": "http", "url": f"http://127.0.0.1:{free_port()}/"},
    }
    run_id = await make_run(live, await make_flow(live, {"program": "f"}, tools=[down]))
    code, out, err = await orchctl(live, "steps", "submit", run_id, "--tool", "down", "--follow")
    assert code == 1
    assert out == ""
    assert re.fullmatch(r"orchctl: step_\w+ error: TOOL_ERROR: .+", err.splitlines()[-1])


# --- facts and checkpoints ------------------------------------------------------------------


async def test_facts_add_and_list(live: httpx.AsyncClient, tmp_path: Path) -> None:
    flow_id = await make_flow(live, {"program": "facts"})
    run_id = await make_run(live, flow_id)
    code, out, err = await orchctl(live, "facts", "add", run_id, "note", '{"n": 1}')
    assert (code, err) == (0, "")
    assert (row(out, "type"), row(out, "data")) == ("note", '{"n": 1}')
    data = tmp_path / "fact.json"
    data.write_text("[1, 2]")
    argv = ["facts", "add", run_id, "list", f"@{data}", "--client-token", "f"]
    added = await as_json(live, *argv)
    assert (added["type"], added["data"], added["run_id"]) == ("list", [1, 2], run_id)
    assert (await as_json(live, *argv))["fact_id"] == added["fact_id"]

    facts = await as_json(live, "facts", "list", run_id)
    assert [(f["type"], f["data"]) for f in facts] == [("note", {"n": 1}), ("list", [1, 2])]
    only = await as_json(live, "facts", "list", run_id, "--type", "list")
    assert [f["fact_id"] for f in only] == [added["fact_id"]]
    page = await as_json(live, "facts", "list", run_id, "--after", facts[0]["fact_id"])
    assert [f["fact_id"] for f in page] == [added["fact_id"]]
    of_flow = await as_json(live, "facts", "list", "--flow", flow_id, "--limit", "1")
    assert [f["fact_id"] for f in of_flow] == [facts[0]["fact_id"]]
    code, out, _ = await orchctl(live, "facts", "list", run_id)
    rows = table(out)
    assert rows[0] == ["FACT", "TYPE", "RUN", "STEP", "CREATED", "DATA"]
    assert [(r[1], r[-1]) for r in rows[1:]] == [("note", '{"n": 1}'), ("list", "[1, 2]")]

    code, _, err = await orchctl(live, "facts", "add", run_id, "note", "{bad")
    assert code == 2
    assert err.startswith("orchctl: DATA is not JSON")
    code, _, err = await orchctl(live, "facts", "add", run_id, "note", "null")
    assert code == 2
    assert f"add of a note fact to {run_id}: INVALID_PARAMS: data" in err
    code, _, err = await orchctl(live, "facts", "list")
    assert code == 2
    assert "RUN_ID or --flow" in err


async def test_checkpoints_create_and_list(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    code, out, err = await orchctl(live, "checkpoints", "create", run_id, '{"turn": 1}')
    assert (code, err) == (0, "")
    first = row(out, "checkpoint_id")
    assert row(out, "state") == '{"turn": 1}'
    argv = ["checkpoints", "create", run_id, "-", "--client-token", "c2"]
    made = await as_json(live, *argv, stdin='{"turn": 2}')
    assert (made["state"], made["run_id"]) == ({"turn": 2}, run_id)
    assert made["state_hash"].startswith("sha256:")
    assert (await as_json(live, *argv, stdin='{"turn": 2}'))["checkpoint_id"] == made[
        "checkpoint_id"
    ]
    listed = await as_json(live, "checkpoints", "list", run_id)
    assert [c["checkpoint_id"] for c in listed] == [first, made["checkpoint_id"]]
    code, out, _ = await orchctl(live, "checkpoints", "list", run_id)
    assert [r[0] for r in table(out)] == ["CHECKPOINT", first, made["checkpoint_id"]]
    code, _, err = await orchctl(live, "checkpoints", "create", run_id, "[1]")
    assert code == 2
    assert "STATE must be a JSON object" in err


# --- pools ----------------------------------------------------------------------------------


async def test_pools_list_get_drain_and_undrain(live: httpx.AsyncClient) -> None:
    pools = await as_json(live, "pools", "list")
    assert pools == await api(live, "GET", "/v1/pools")
    pool = pools[0]
    pool_id, replica_id = pool["pool_id"], pool["replicas"][0]["replica_id"]
    code, out, _ = await orchctl(live, "pools", "list")
    rows = table(out)
    assert rows[0][:4] == ["POOL", "ENGINE", "HEALTH", "READY"]
    assert rows[1][:4] == [pool_id, "sim", "ready", "1/1"]

    code, out, _ = await orchctl(live, "pools", "get", pool_id)
    assert (code, row(out, "pool_id"), row(out, "engine")) == (0, pool_id, "sim")
    replicas = table(out[out.index("REPLICA") :])
    assert replicas[0][:3] == ["REPLICA", "STATE", "HEALTH"]
    assert replicas[1][:2] == [replica_id, "ready"]

    drained = await as_json(live, "pools", "drain", pool_id, replica_id)
    assert drained["replicas"][0]["state"] == "draining"
    code, out, _ = await orchctl(live, "pools", "undrain", pool_id, replica_id)
    assert code == 0
    assert table(out)[1][:2] == [replica_id, "ready"]
    code, _, err = await orchctl(live, "pools", "drain", pool_id, "r_nope")
    assert code == 2
    assert err.startswith(f"orchctl: drain of {pool_id}/r_nope: NOT_FOUND: ")


async def test_pools_create_from_files_and_delete(live: httpx.AsyncClient, tmp_path: Path) -> None:
    one = tmp_path / "pool.json"
    one.write_text(
        json.dumps(
            {"pool_id": "p1", "engine": "sim", "replicas": [{"replica_id": "a", "slots": 2}]}
        )
    )
    made = await as_json(live, "pools", "create", str(one))
    assert [(p["pool_id"], p["source"], p["replicas"][0]["slots"]) for p in made] == [
        ("p1", "api", 2)
    ]
    several = tmp_path / "pools.yaml"
    several.write_text(
        "pools:\n"
        "  - pool_id: p2\n    engine: sim\n    tags: {tier: b}\n    replicas: [{replica_id: x}]\n"
        "  - pool_id: p3\n    engine: sim\n    replicas: [{replica_id: y}]\n"
    )
    code, out, err = await orchctl(live, "pools", "create", str(several))
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("pool_id")] == [
        "p2",
        "p3",
    ]
    listed = {p["pool_id"] for p in await as_json(live, "pools", "list")}
    assert {"p1", "p2", "p3"} <= listed

    assert await as_json(live, "pools", "delete", "p1") == {"pool_id": "p1", "deleted": True}
    for pool_id in ("p2", "p3"):
        code, out, _ = await orchctl(live, "pools", "delete", pool_id)
        assert (code, out) == (0, f"deleted pool {pool_id}\n")
    code, out, err = await orchctl(live, "pools", "get", "p1", "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "NOT_FOUND"
    code, _, err = await orchctl(live, "pools", "create", "-", stdin="[]")
    assert code == 2
    assert "holds no pool" in err


async def test_pools_provision_and_delete(live: httpx.AsyncClient) -> None:
    argv = ["pools", "provision", "--pool-id", "fk", "--provisioner", "fake", "--slots", "2"]
    code, _, err = await orchctl(live, *argv, "--option", "n_ctx=512")
    assert code == 2  # the options reach the provisioner, which takes none
    assert "INVALID_PARAMS: options: the 'fake' provisioner takes no options" in err
    pool = await as_json(live, *argv, "--tag", "kind=test")
    try:
        assert (pool["pool_id"], pool["source"], pool["tags"]) == (
            "fk",
            "provisioned",
            {"kind": "test"},
        )
        assert pool["provision"]["request"]["slots"] == 2
        assert [r["slots"] for r in pool["replicas"]] == [2]
    finally:
        code, _, err = await orchctl(live, "pools", "delete", "fk")
        assert code == 0, err
    code, _, err = await orchctl(live, "pools", "provision", "--pool-id", "x")
    assert code == 2
    assert "pools provision needs --provisioner" in err
    code, _, err = await orchctl(
        live, "pools", "provision", "--pool-id", "x", "--provisioner", "nope"
    )
    assert code == 2
    assert "provision of a pool: INVALID_PARAMS: provisioner: unknown provisioner 'nope'" in err


# --- errors and output ----------------------------------------------------------------------

UNKNOWN = [
    ["flows", "get", "flow_nope"],
    ["runs", "get", "run_nope"],
    ["runs", "watch", "run_nope"],
    ["runs", "complete", "run_nope"],
    ["runs", "cancel", "run_nope"],
    ["runs", "export", "run_nope"],
    ["steps", "list", "run_nope"],
    ["steps", "get", "step_nope"],
    ["steps", "cancel", "step_nope"],
    ["steps", "stream", "step_nope"],
    ["steps", "submit", "run_nope", "--gate", "true"],
    ["facts", "add", "run_nope", "t", "1"],
    ["checkpoints", "create", "run_nope", "{}"],
    ["checkpoints", "list", "run_nope"],
    ["pools", "get", "pool_nope"],
    ["pools", "delete", "pool_nope"],
]


async def test_an_unknown_id_exits_2_with_the_code_on_stderr(live: httpx.AsyncClient) -> None:
    for argv in UNKNOWN:
        code, out, err = await orchctl(live, *argv)
        assert (code, out) == (2, ""), argv
        assert re.match(r"orchctl: .+: NOT_FOUND: .+\n  \(HTTP 404, correlation id .+\)\n$", err), (
            err
        )
        code, out, err = await orchctl(live, *argv, "--json")
        assert code == 2, argv
        assert json.loads(out)["error"]["code"] == "NOT_FOUND", argv


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colours_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.text import Text

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for stream, coloured in ((_Terminal(), True), (io.StringIO(), False)):
        make_console(stream).print(Text("ok", style="green"))
        assert ("\x1b[" in stream.getvalue()) is coloured
    monkeypatch.setenv("NO_COLOR", "1")
    stream = _Terminal()
    make_console(stream).print(Text("ok", style="green"))
    assert stream.getvalue() == "ok\n"
