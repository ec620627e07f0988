"""orchctl's replay commands (replay, report, export, import, also under ``runs``): verdicts,
rendering, exit codes and options over a mock transport, then replays against a server;
and the SDK paths those commands stand on (SSE parsing, resuming a stream, retrying a
write with the same token)."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from contracts.events import EndEvent, StartedEvent, TokenEvent
from contracts.replay import ReplayReport
from orchestrator_client import ApiError, Client, Retry, Unreachable, steps
from orchestrator_client.errors import PolicyDenied
from orchestrator_client.orchctl import cli, common, main
from orchestrator_client.orchctl import replay as orchctl_replay
from orchestrator_client.replay import StepReplay, follow_to_end, replay_run, replay_step_body
from orchestrator_client.sse import SseEvent, SseParser, parse_sse
from orchestratord.db.models import Event
from orchestratord.runtime import Orchestrator
from tests.helpers import make_flow, make_run, submit, wait_status
from tests.procs import free_port, orchestratord

# --- SSE parsing ----------------------------------------------------------------------------


def test_sse_events_comments_and_ids() -> None:
    body = (
        ": keep-alive\n\n"
        'id: 0\nevent: started\ndata: {"seq": 0}\n\n'
        ": keep-alive\n"
        'id: 1\nevent: token\ndata: {"i": 0, "t": "a"}\n\n'
    )
    events = parse_sse(body)
    assert events == [
        SseEvent("started", '{"seq": 0}', "0"),
        SseEvent("token", '{"i": 0, "t": "a"}', "1"),
    ]
    assert events[1].json() == {"i": 0, "t": "a"}


def test_sse_multi_line_data_crlf_and_field_rules() -> None:
    body = (
        '\ufeffevent: end\r\ndata: {"a":\r\ndata:  1}\r\n\r\n'  # second line keeps one space
        "event: lonely\n\n"  # no data: not dispatched
        "data\n\n"  # a field without colon: empty data line
        "id: 7\nretry: 250\ndata: x\n\n"
        "data: unterminated"
    )
    events = parse_sse(body)
    assert events == [
        SseEvent("end", '{"a":\n 1}', None),
        SseEvent("message", "", None),
        SseEvent("message", "x", "7"),
    ]
    assert events[0].json() == {"a": 1}


def test_sse_parser_counts_comments_and_keeps_last_id() -> None:
    parser = SseParser(last_event_id="4")
    assert parser.feed(": keep-alive") is None
    assert parser.feed("") is None  # blank after a comment dispatches nothing
    assert parser.feed("event: token") is None
    assert parser.feed('data: {"i": 5}') is None
    event = parser.feed("")
    assert event == SseEvent("token", '{"i": 5}', None)  # no id line: no id of its own
    assert parser.last_event_id == "4"
    parser.feed("retry: soon")
    assert parser.retry_ms is None
    assert parser.comments == 1


def test_event_data_must_be_an_object() -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        SseEvent("token", "[1]").json()


# --- following a stream and retrying writes over a mock transport ---------------------------


class _Dropping(httpx.SyncByteStream):
    """A body that sends ``chunks`` and then loses the connection."""

    def __init__(self, chunks: list[bytes], *, drop: bool = True) -> None:
        self.chunks, self.drop = chunks, drop

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.drop:
            raise httpx.ReadError("connection reset by peer")


def _sse(seq: int, event: str, data: dict[str, Any]) -> bytes:
    data = {"step_id": "step_1", "seq": seq, "type": event, **data}
    return f"id: {seq}\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


STARTED = {"pool_id": "sim", "replica_id": "r0", "engine": "sim"}
END = {"stop_reason": "length", "tokens_in": 1, "tokens_out": 2, "provenance": None}


def _mock_client(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> Client:
    return Client("http://orch.test", transport=httpx.MockTransport(handler), **kw)


def test_a_stream_resumes_after_a_drop_with_last_event_id() -> None:
    seen_headers: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_headers.append(request.headers.get("last-event-id"))
        if len(seen_headers) == 1:
            chunks = [_sse(0, "started", STARTED), b": keep-alive\n\n"]
            chunks.append(_sse(1, "token", {"i": 0, "t": "a", "token_id": 1}))
            body = _Dropping([*chunks, b"id: 2\nevent: tok"])  # dropped mid-event
        elif len(seen_headers) == 2:
            body = _Dropping([], drop=False)  # closes cleanly before the end: resume again
        else:
            token = _sse(2, "token", {"i": 1, "t": "b", "token_id": 2})
            body = _Dropping([token, _sse(3, "end", END)], drop=False)
        return httpx.Response(200, stream=body, headers={"content-type": "text/event-stream"})

    with _mock_client(handler) as client:
        events = list(client.stream_step("step_1"))
    assert [type(e) for e in events] == [StartedEvent, TokenEvent, TokenEvent, EndEvent]
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert seen_headers == [None, "1", "1"]


def test_a_stream_gives_up_after_its_silence_limit() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, stream=_Dropping([]))

    with (
        _mock_client(handler, stream_give_up_s=0.2) as client,
        pytest.raises(Unreachable, match="gave up resuming"),
    ):
        list(client.stream_step("step_1"))
    assert calls >= 2


def test_a_stream_of_an_unknown_step_is_an_api_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"code": "NOT_FOUND", "message": "step step_x not found", "retriable": False}
        return httpx.Response(404, json=body, headers={"x-correlation-id": "c-1"})

    with _mock_client(handler) as client, pytest.raises(ApiError) as info:
        list(client.stream_step("step_x"))
    assert (info.value.status, info.value.code) == (404, "NOT_FOUND")
    assert info.value.correlation_id == "c-1"


def test_non_json_error_keeps_the_status() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="Bad Gateway")

    with _mock_client(handler, retry=Retry(attempts=1)) as client, pytest.raises(ApiError) as info:
        client.get_run("run_1")
    assert (info.value.code, info.value.message) == ("HTTP_502", "Bad Gateway")


def test_replay_step_body_repeats_the_recorded_request() -> None:
    recorded = {
        "step_id": "step_old",
        "position": 0,
        "type": "llm_call",
        "client_token": "a",
        "input": {"prompt": "hi", "params": {"max_tokens": 4}},
        "budgets": {"max_tokens_out": 10},
        "placement": {"pin": "sim"},
        "priority": "batch",
        "status": "succeeded",
    }
    assert replay_step_body(recorded) == {
        "type": "llm_call",
        "client_token": "a",
        "input": {"prompt": "hi", "params": {"max_tokens": 4}},
        "budgets": {"max_tokens_out": 10},
        "placement": None,
        "priority": "batch",
    }


def test_a_write_is_retried_with_the_same_token() -> None:
    full = {"code": "ADMISSION_REJECT", "message": "full", "retriable": True, "retry_after_ms": 0}
    answers: list[httpx.Response | Exception] = [
        httpx.Response(429, json=full),
        httpx.ReadTimeout("the answer was lost"),
        httpx.Response(202, json={"step_id": "step_1", "status": "queued"}),
        httpx.Response(403, json={"code": "POLICY_DENIED", "message": "no", "retriable": False}),
    ]
    tokens: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tokens.append(json.loads(request.content)["client_token"])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with _mock_client(handler, retry=Retry(backoff_s=0.0)) as client:
        step = steps.llm_call("hi", client_token="a")
        assert client.submit_step("run_1", step).step_id == "step_1"
        with pytest.raises(PolicyDenied, match="POLICY_DENIED"):
            client.submit_step("run_1", step)
    assert tokens == ["a", "a", "a", "a"]


# --- verdicts, exit codes and rendering -----------------------------------------------------


def _report(**over: Any) -> ReplayReport:
    counts = {k: 0 for k in orchctl_replay.OUTCOMES}
    counts.update(over.pop("counts", {}))
    return ReplayReport.model_validate(
        {
            "run_id": "run_r",
            "source_run_id": "run_s",
            "mode": "strict_replay",
            "diverged": False,
            "complete": True,
            "counts": counts,
            "steps": [],
            **over,
        }
    )


@pytest.mark.parametrize(
    ("report", "word", "code"),
    [
        (_report(counts={"identical": 2}), "IDENTICAL", 0),
        (_report(), "IDENTICAL", 0),
        (_report(diverged=True, counts={"identical": 1, "diverged": 1}), "DIVERGED", 1),
        (_report(diverged=True, counts={"missed": 1}), "MISSED", 1),
        (_report(diverged=True, counts={"failed": 1}), "FAILED", 1),
        (_report(diverged=True), "DIVERGED", 1),
        (_report(complete=False, counts={"not_replayed": 1}), "INCOMPLETE", 1),
        (_report(complete=False, counts={"pending": 1}), "INCOMPLETE", 1),
    ],
)
def test_verdict_and_exit_code(report: ReplayReport, word: str, code: int) -> None:
    assert orchctl_replay.verdict(report) == word
    assert orchctl_replay.exit_code(report) == code


def test_render_report_shows_the_divergence() -> None:
    report = _report(
        diverged=True,
        counts={"identical": 1, "diverged": 1},
        steps=[
            {
                "position": 0,
                "step_id": "step_a",
                "recorded_step_id": "step_ra",
                "status": "succeeded",
                "outcome": "identical",
                "tokens_out": 8,
                "divergence": None,
                "miss": None,
            },
            {
                "position": 1,
                "step_id": "step_b",
                "recorded_step_id": "step_rb",
                "status": "failed",
                "outcome": "diverged",
                "tokens_out": 3,
                "divergence": {
                    "step_id": "step_b",
                    "recorded_step_id": "step_rb",
                    "position": 1,
                    "token_index": 3,
                    "expected": {"t": " river", "token_id": 17},
                    "actual": {"t": "\n", "token_id": None},
                    "context": {"before": ["The", " quiet"], "expected_after": []},
                },
                "miss": None,
            },
        ],
    )
    text = orchctl_replay.render_report(report, "run_r")
    lines = text.splitlines()
    assert lines[0] == "replay run_r of run_s (strict_replay): DIVERGED"
    assert "identical 1, diverged 1, missed 0" in lines[1]
    assert lines[2] == "  #0 step_a (recorded step_ra) identical, 8 tokens"
    assert lines[3] == "  #1 step_b (recorded step_rb) diverged, 3 tokens"
    assert lines[4:] == [
        "      diverged at token 3 (step step_b, recorded step_rb)",
        "        expected:               ' river' (token_id 17)",
        "        actual:                 '\\n'",
        "        context before:         'The' ' quiet'",
        "        context expected after: (none)",
    ]


def test_render_divergence_at_the_end_and_a_miss() -> None:
    lines = orchctl_replay.render_divergence(
        {"token_index": 4, "expected": {"end": "eos"}, "actual": {"t": "x", "token_id": 9}},
        indent="",
    )
    assert lines == [
        "diverged at token 4",
        "  expected: end of output (eos)",
        "  actual:   'x' (token_id 9)",
    ]
    lines = orchctl_replay.render_divergence(
        {
            "token_index": 0,
            "expected": {"t": "a", "token_id": 1},
            "actual": {"error": "ENGINE_ERROR"},
            "context": [{"t": " b", "token_id": 2}, "c"],
        },
        indent="",
    )
    assert lines[2:] == ["  actual:   error ENGINE_ERROR", "  context:  ' b' 'c'"]
    assert orchctl_replay.render_miss({"differs": ["prompt", "params"]}, indent="") == [
        "no recorded step matches; differs: prompt, params"
    ]
    miss = {
        "message": "the step differs from the recorded step at position 2 in: prompt_hash",
        "position": 2,
        "source_run_id": "run_s",
        "recorded_step_id": "step_rc",
        "differs": ["prompt_hash"],
        "inputs": [{"input": "prompt_hash", "recorded": "sha256:a", "submitted": "sha256:b"}],
        "hint": "x",
    }
    assert orchctl_replay.render_miss(miss, indent="") == [
        "no recorded step matches; differs: prompt_hash",
        "  the step differs from the recorded step at position 2 in: prompt_hash",
        '  prompt_hash: recorded "sha256:a", submitted "sha256:b"',
        '  {"hint": "x"}',
    ]


def test_render_refusal_lists_every_mismatch() -> None:
    body = {
        "code": "STRICT_REPLAY_MISMATCH",
        "message": "the current deployment cannot replay run_s strictly",
        "retriable": False,
        "retry_after_ms": None,
        "details": {
            "mismatches": [
                {"input": "seed", "recorded": 42, "current": 7},
                {"input": "engine_version", "recorded": "sim-1", "current": "sim-2"},
                {
                    "input": "replica",
                    "pool_id": "sim",
                    "replica_id": "r0",
                    "recorded": "r0",
                    "current": None,
                },
                {"input": "policy", "recorded": "sha256:1", "current": "sha256:2", "message": "m"},
                {"input": "future", "recorded": 1, "current": 2, "extra": True},
            ]
        },
        "correlation_id": "corr-9",
    }
    text = common.render_error(ApiError(409, body), "strict_replay of run_s")
    assert text.splitlines() == [
        "orchctl: strict_replay of run_s: STRICT_REPLAY_MISMATCH: "
        "the current deployment cannot replay run_s strictly",
        "  mismatch seed: recorded 42, current 7",
        '  mismatch engine_version: recorded "sim-1", current "sim-2"',
        '  mismatch replica on sim/r0: recorded "r0", current null',
        '  mismatch policy: recorded "sha256:1", current "sha256:2" (m)',
        '  mismatch future: recorded 1, current 2 {"extra": true}',
        "  (HTTP 409, correlation id corr-9)",
    ]


def test_render_progress_line() -> None:
    diverged = StepReplay(
        1,
        "step_rb",
        "step_b",
        3,
        error={"code": "REPLAY_DIVERGED", "details": {"divergence": {"token_index": 3}}},
    )
    assert orchctl_replay.render_progress(diverged) == (
        "  #1 step_b (recorded step_rb) 3 tokens, REPLAY_DIVERGED at token 3\n"
    )
    ok = StepReplay(0, "step_ra", "step_a", 8, ended="length")
    assert orchctl_replay.render_progress(ok).endswith("8 tokens, end (length)\n")
    miss = StepReplay(2, "step_rc", "step_c", 0, error={"code": "REPLAY_MISS", "details": {}})
    assert orchctl_replay.render_progress(miss).endswith("0 tokens, REPLAY_MISS\n")


# --- the CLI over a mock transport ----------------------------------------------------------


def _run_cli(
    monkeypatch: pytest.MonkeyPatch,
    handler: Callable[[httpx.Request], httpx.Response],
    *argv: str,
) -> tuple[int, str, str, list[str]]:
    urls: list[str] = []

    def factory(base_url: str, **kw: Any) -> Client:
        urls.append(base_url)
        return Client(base_url, transport=httpx.MockTransport(handler), **kw)

    monkeypatch.setattr(cli, "Client", factory)
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue(), urls


RECORDED_RUN = {
    "run_id": "run_s",
    "flow_id": "flow_f",
    "mode": "record",
    "seed": 42,
    "source_run_id": None,
    "status": "succeeded",
    "budgets": {},
    "usage": {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0},
    "reserved": {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0},
    "price_table": "t",
    "policy_hash": "sha256:0",
    "policy": {"rules": []},
    "pool_policy": "auto",
    "fs_policy": {},
    "cancel_on_disconnect": None,
    "step_count": 0,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
}


@pytest.mark.parametrize("command", [["replay"], ["runs", "replay"]], ids=["alias", "runs"])
def test_refused_strict_replay_exits_2_with_the_mismatches(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    refusal = {
        "code": "STRICT_REPLAY_MISMATCH",
        "message": "cannot replay strictly",
        "retriable": False,
        "retry_after_ms": None,
        "details": {"mismatches": [{"input": "model_hash", "recorded": "a", "current": "b"}]},
        "correlation_id": "c",
    }
    created: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/runs/run_s":
            return httpx.Response(200, json=RECORDED_RUN)
        if path == "/v1/runs/run_s/steps":
            return httpx.Response(200, json=[])
        if path == "/v1/flows/flow_f/runs":
            created.append(json.loads(request.content))
            return httpx.Response(409, json=refusal)
        return httpx.Response(404, json={"code": "NOT_FOUND", "message": path})

    code, out, err, _ = _run_cli(monkeypatch, handler, *command, "run_s", "--strict")
    assert code == 2
    assert out == ""
    assert "orchctl: strict_replay of run_s: STRICT_REPLAY_MISMATCH: cannot replay" in err
    assert '  mismatch model_hash: recorded "a", current "b"' in err
    assert len(created) == 1
    assert {k: created[0][k] for k in ("mode", "source_run_id", "seed")} == {
        "mode": "strict_replay",
        "source_run_id": "run_s",
        "seed": 42,
    }

    code, out, err, _ = _run_cli(monkeypatch, handler, *command, "run_s", "--strict", "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "STRICT_REPLAY_MISMATCH"


def test_url_from_flag_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=_report(counts={"identical": 1}).model_dump(mode="json"))

    for name in ("ORCHCTL_URL", "ORCHESTRATOR_URL"):
        monkeypatch.delenv(name, raising=False)
    code, out, _, urls = _run_cli(monkeypatch, handler, "report", "run_r")
    assert code == 0
    assert out.startswith("replay run_r of run_s (strict_replay): IDENTICAL")
    monkeypatch.setenv("ORCHESTRATOR_URL", "http://sdk.test:9")
    urls += _run_cli(monkeypatch, handler, "report", "run_r")[3]
    monkeypatch.setenv("ORCHCTL_URL", "http://env.test:1")
    urls += _run_cli(monkeypatch, handler, "report", "run_r")[3]
    urls += _run_cli(monkeypatch, handler, "--url", "http://a.test:2", "report", "run_r")[3]
    urls += _run_cli(monkeypatch, handler, "report", "run_r", "--url", "http://b.test:3")[3]
    urls += _run_cli(monkeypatch, handler, "runs", "--url", "http://c.test:4", "report", "x")[3]
    assert urls == [
        common.DEFAULT_URL,
        "http://sdk.test:9",
        "http://env.test:1",
        "http://a.test:2",
        "http://b.test:3",
        "http://c.test:4",
    ]
    assert common.DEFAULT_URL == "http://127.0.0.1:8080"


def test_api_key_from_env_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json=_report(counts={"identical": 1}).model_dump(mode="json"))

    for name in ("ORCHCTL_API_KEY", "ORCHESTRATOR_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert _run_cli(monkeypatch, handler, "report", "run_r")[0] == 0
    monkeypatch.setenv("ORCHCTL_API_KEY", "ok_0123456789ab_secret")
    assert _run_cli(monkeypatch, handler, "report", "run_r")[0] == 0
    assert seen == [None, "Bearer ok_0123456789ab_secret"]


def test_unreachable_server_exits_2() -> None:
    out, err = io.StringIO(), io.StringIO()
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--url", url, "--timeout", "5", "report", "run_x", "--json"]
    code = main(argv, stdout=out, stderr=err)
    assert code == 2
    assert err.getvalue().startswith("orchctl: replay report of run_x: UNREACHABLE: GET ")
    assert json.loads(out.getvalue())["error"]["code"] == "UNREACHABLE"


def test_help_explains_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--strict" in text
    assert "exit status: 0 complete and identical" in text
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for line in ("exit status:", "  1    what was asked about failed", "  130  interrupted"):
        assert line in text
    for noun in ("flows", "runs", "steps", "facts", "checkpoints", "pools"):
        assert f"    {noun} " in text


def test_a_bad_command_line_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["runs", "frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


# --- end to end: a real server on a loopback port -------------------------------------------


async def _record(live: httpx.AsyncClient, steps: int = 3, seed: int = 7) -> tuple[str, list[str]]:
    run_id = await make_run(live, await make_flow(live, {"orchctl": 1}), seed=seed)
    step_ids = []
    for i in range(steps):
        r = await submit(live, run_id, token=f"s{i}", prompt=f"step {i}: rivers", max_tokens=6 + i)
        assert r.status_code == 202, r.text
        step_ids.append(r.json()["step_id"])
        await wait_status(live, step_ids[-1], "succeeded")
    return run_id, step_ids


async def _orchctl(live: httpx.AsyncClient, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    # a thread: the server runs in this event loop, the CLI blocks
    run = functools.partial(main, stdout=out, stderr=err)
    code = await asyncio.to_thread(run, ["--url", str(live.base_url), *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("strict", [False, True], ids=["replay", "strict"])
async def test_replay_of_a_recorded_run_is_identical(live: httpx.AsyncClient, strict: bool) -> None:
    run_id, recorded = await _record(live)
    code, out, err = await _orchctl(live, "replay", run_id, *(["--strict"] if strict else []))
    assert code == 0, out + err
    mode = "strict_replay" if strict else "replay"
    header = out.splitlines()[0]
    assert header.startswith("replay run_") and header.endswith(f"of {run_id} ({mode}): IDENTICAL")
    for position, step_id in enumerate(recorded):
        assert f"#{position} step_" in out
        assert f"(recorded {step_id}) identical, {6 + position} tokens" in out
    progress = err.splitlines()
    assert len(progress) == 3
    assert all(line.endswith("end (length)") for line in progress), err

    # the replay run is what the report says
    replay_id = header.split()[1]
    run = (await live.get(f"/v1/runs/{replay_id}")).json()
    assert (run["mode"], run["source_run_id"], run["seed"]) == (mode, run_id, 7)
    # report on the existing replay run, at the top and under runs: same verdict and code
    for command in (["report"], ["runs", "report"]):
        code, again, _ = await _orchctl(live, *command, replay_id)
        assert (code, again.splitlines()[0]) == (0, header)


async def _tamper_token(orch: Orchestrator, step_id: str, i: int, text: str) -> None:
    """Rewrite one recorded token in the log, as if the record had been made elsewhere."""
    async with orch.db.engine.begin() as conn:
        rows = (
            await conn.execute(
                sa.select(Event.id, Event.data).where(
                    Event.step_id == step_id, Event.type == "token"
                )
            )
        ).all()
        for row in rows:  # a row may hold several token events, one JSON text per line
            lines = [json.loads(line) for line in row.data.split("\n")]
            for data in lines:
                if data["i"] == i:
                    data.update(t=text, token_id=-1)
                    stored = "\n".join(json.dumps(d, separators=(",", ":")) for d in lines)
                    await conn.execute(
                        sa.update(Event).where(Event.id == row.id).values(data=stored)
                    )
                    return
        raise AssertionError(f"token {i} of {step_id} is not in the log")


async def test_strict_replay_reports_a_divergence(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    run_id, recorded = await _record(live, steps=2)
    await _tamper_token(orch, recorded[1], 2, " river\n")
    code, out, err = await _orchctl(live, "replay", run_id, "--strict")
    assert code == 1, out + err
    assert out.splitlines()[0].endswith(f"of {run_id} (strict_replay): DIVERGED")
    assert "identical 1, diverged 1" in out
    assert f"(recorded {recorded[1]}) diverged" in out
    assert "diverged at token 2" in out
    assert "expected:               ' river\\n' (token_id -1)" in out
    assert "context before:" in out
    assert err.splitlines()[1].endswith("REPLAY_DIVERGED at token 2")

    code, out, _ = await _orchctl(live, "runs", "replay", run_id, "--strict", "--json")
    assert code == 1
    divergence = json.loads(out)["steps"][1]["divergence"]
    assert divergence["token_index"] == 2
    assert divergence["expected"] == {"t": " river\n", "token_id": -1}
    # a plain replay serves the record as it is: identical
    code, out, _ = await _orchctl(live, "replay", run_id)
    assert code == 0, out


async def test_replay_json_report(live: httpx.AsyncClient) -> None:
    run_id, recorded = await _record(live, steps=2)
    code, out, err = await _orchctl(live, "replay", run_id, "--strict", "--json")
    assert code == 0, out + err
    assert err == ""  # no progress with --json
    report = json.loads(out)
    assert report["replay_run_id"] == report["run_id"]
    assert report["source_run_id"] == run_id
    assert (report["mode"], report["diverged"], report["complete"]) == (
        "strict_replay",
        False,
        True,
    )
    assert report["counts"]["identical"] == 2
    assert [s["recorded_step_id"] for s in report["steps"]] == recorded
    assert [s["outcome"] for s in report["steps"]] == ["identical", "identical"]


async def test_client_records_a_run_it_can_replay(live: httpx.AsyncClient) -> None:
    url = str(live.base_url)

    def record_and_replay() -> tuple[str, ReplayReport]:
        with Client(url) as client:
            flow = client.create_flow({"ast": {"client": 1}})
            run_id = client.create_run(flow.flow_id, {"seed": 11}).run_id
            for i in range(2):
                step = steps.llm_call(f"p{i}", client_token=f"c{i}", max_tokens=3)
                step_id = client.submit_step(run_id, step).step_id
                assert follow_to_end(client, step_id) == (3, "length", None)
            assert [s.client_token for s in client.list_steps(run_id)] == ["c0", "c1"]
            return replay_run(client, run_id, strict=True)

    replay_id, report = await asyncio.to_thread(record_and_replay)
    assert report.run_id == replay_id
    assert orchctl_replay.verdict(report) == "IDENTICAL"


async def test_replay_of_an_unknown_run_exits_2(live: httpx.AsyncClient) -> None:
    code, out, err = await _orchctl(live, "replay", "run_doesnotexist", "--strict")
    assert code == 2
    assert out == ""
    assert err.startswith("orchctl: strict_replay of run_doesnotexist: NOT_FOUND: ")
    assert "correlation id" in err


async def test_report_of_an_unknown_run_exits_2(live: httpx.AsyncClient) -> None:
    code, out, err = await _orchctl(live, "report", "run_doesnotexist", "--json")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "NOT_FOUND"
    assert "NOT_FOUND" in err


async def test_export_then_import(live: httpx.AsyncClient, tmp_path: Path) -> None:
    run_id, _ = await _record(live, steps=1)
    bundle = tmp_path / "run.json"
    code, out, err = await _orchctl(live, "export", run_id, "-o", str(bundle))
    assert code == 0, err
    assert out == ""
    assert err == f"orchctl: wrote {run_id} to {bundle}\n"
    assert run_id in bundle.read_text()
    code, out, err = await _orchctl(live, "import", str(bundle))
    assert code == 0, err
    assert json.loads(out)["run_id"] == run_id  # ids are kept; the same bundle is the same run
    code, out, err = await _orchctl(live, "runs", "export", run_id)
    assert code == 0, err
    assert json.loads(out) == json.loads(bundle.read_text())
    code, out, err = await _orchctl(live, "runs", "import", str(tmp_path / "absent.json"))
    assert code == 2
    assert out == ""
    assert err.startswith(f"orchctl: cannot read {tmp_path / 'absent.json'}: ")


# --- the installed console script against an orchestratord process --------------------------


@pytest.mark.slow
def test_console_script_replays_against_a_server_process(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "orchctl"
    exe = str(script) if script.exists() else shutil.which("orchctl")
    assert exe, "the orchctl console script is not installed (pip install -e .)"
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
    db = f"sqlite:///{tmp_path / 'orch.db'}"
    with orchestratord(tmp_path, "--engine", "sim", "--database-url", db, env=env) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            flow = c.post("/v1/flows", json={"ast": {"script": 1}}).json()["flow_id"]
            run_id = c.post(f"/v1/flows/{flow}/runs", json={"seed": 5}).json()["run_id"]
            for i in range(2):
                step = {
                    "type": "llm_call",
                    "client_token": f"s{i}",
                    "input": {"prompt": f"p{i}", "params": {"max_tokens": 5}},
                }
                assert c.post(f"/v1/runs/{run_id}/steps", json=step).status_code == 202
            # orchctl follows each recorded step's replay; the recorded ones must be done
            for _ in range(600):
                steps = c.get(f"/v1/runs/{run_id}/steps").json()
                if all(s["status"] == "succeeded" for s in steps):
                    break
                time.sleep(0.05)
        done = subprocess.run(
            [exe, "replay", run_id, "--strict", "--json"],
            env={"ORCHCTL_URL": url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["counts"]["identical"] == 2
        refused = subprocess.run(
            [exe, "--url", url, "replay", "run_nope"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2
        assert "NOT_FOUND" in refused.stderr


def test_report_against_a_server_with_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestratord.cli import main as server_cli

    url = f"sqlite:///{tmp_path / 'k.db'}"
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert server_cli(["keys", "create", "--scope", "read", "--database-url", url]) == 0
    monkeypatch.undo()
    key = out.getvalue().strip()
    with orchestratord(tmp_path, "--engine", "sim", "--database-url", url) as base:
        for name in ("ORCHCTL_API_KEY", "ORCHESTRATOR_API_KEY"):
            monkeypatch.delenv(name, raising=False)
        o, e = io.StringIO(), io.StringIO()
        assert main(["--url", base, "report", "run_x"], stdout=o, stderr=e) == 2
        assert "UNAUTHENTICATED" in e.getvalue()
        monkeypatch.setenv("ORCHCTL_API_KEY", key)
        o, e = io.StringIO(), io.StringIO()
        assert main(["--url", base, "report", "run_x"], stdout=o, stderr=e) == 2
        assert "NOT_FOUND" in e.getvalue()  # past auth: the run does not exist
