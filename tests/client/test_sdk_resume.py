"""A stream followed through the SDK survives the server going away: killed mid-step and
started again on the same port and database, the stream resumes with ``Last-Event-ID`` and
yields every event of the step once, in order, to its end (the restarted process reaps the
step its earlier incarnation held)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from contracts.events import ErrorEvent, EventBase, TokenEvent
from orchestrator_client import AsyncClient, Client, steps
from tests.procs import free_port, process

ENV = {
    "ORCHESTRATORD_SIM__TOKENS_PER_S": "40",
    "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
    "ORCHESTRATORD_INSTANCE": "resume-test",
}


@contextlib.contextmanager
def server(tmp_path: Path, port: int) -> Iterator[object]:
    cmd = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port), "--engine", "sim"]
    cmd += ["--database-url", f"sqlite:///{tmp_path / 'resume.db'}"]
    url = f"http://127.0.0.1:{port}/healthz"
    with process(cmd, ready_url=url, cwd=tmp_path, env=ENV) as proc:
        yield proc


def _seqs(events: list[EventBase]) -> list[int]:
    return [e.seq for e in events if e.seq is not None]


def test_a_stream_resumes_across_a_server_restart(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: list[EventBase] = []
    five_tokens = threading.Event()
    with server(tmp_path, port) as first, Client(url, stream_give_up_s=60) as client:
        flow = client.create_flow({"ast": {"program": "restart"}})
        run = client.create_run(flow.flow_id, {"seed": 1})
        step = client.submit_step(run.run_id, steps.llm_call("Go on", max_tokens=2000))

        def follow() -> None:
            with Client(url, stream_give_up_s=60) as reader:
                for event in reader.stream_step(step.step_id):
                    seen.append(event)
                    if sum(isinstance(e, TokenEvent) for e in seen) >= 5:
                        five_tokens.set()

        reader = threading.Thread(target=follow)
        reader.start()
        assert five_tokens.wait(30), seen
        first.kill()  # type: ignore[attr-defined]
        first.wait()  # type: ignore[attr-defined]
    with server(tmp_path, port), Client(url) as client:
        reader.join(60)
        assert not reader.is_alive(), "the stream did not end after the restart"
        again = list(client.stream_step(step.step_id))
        ended = client.get_step(step.step_id)
    assert _seqs(seen) == list(range(len(_seqs(seen)))), "a gap or a duplicate"
    assert [(e.seq, e.type) for e in seen] == [(e.seq, e.type) for e in again]
    # the step died with its process: the restarted one ended it, keeping what it committed
    assert isinstance(seen[-1], ErrorEvent) and seen[-1].code == "WORKER_LOST", seen[-1]
    assert ended.status == "failed" and ended.ended_at is not None
    tokens = sum(isinstance(e, TokenEvent) for e in seen)
    assert tokens >= 5 and tokens == sum(isinstance(e, TokenEvent) for e in again)


async def test_the_async_stream_resumes_from_a_given_event(tmp_path: Path) -> None:
    port = free_port()
    with server(tmp_path, port):
        async with AsyncClient(f"http://127.0.0.1:{port}") as client:
            flow = await client.create_flow({"ast": {"program": "from"}})
            run = await client.create_run(flow.flow_id, {"seed": 2})
            ended = await client.run_step(run.run_id, steps.llm_call("x", max_tokens=5))
            whole = [e async for e in client.stream_step(ended.step_id)]
            stream = client.stream_step(ended.step_id, last_event_id=2)
            tail = [e async for e in stream]
    assert _seqs(tail) == _seqs(whole)[3:] and tail[-1].type == "end"
    assert stream.last_event_id == str(whole[-1].seq)
