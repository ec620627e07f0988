from __future__ import annotations

import httpx

from tests.helpers import make_run, read_stream, submit


async def test_step_streams_to_end(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await submit(client, run_id)
    assert r.status_code == 202
    step_id = r.json()["step_id"]
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    assert events[0].event == "started"
    assert events[-1].event == "end"
    assert [int(e.id or -1) for e in events] == list(range(len(events)))
