from __future__ import annotations

from pathlib import Path

import pytest

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import read_stream


async def test_restart_ends_interrupted_steps(tmp_path: Path) -> None:
    """A step left running by a crash gets a terminal error event on the next start."""
    import httpx

    from orchestratord.api.app import create_app
    from tests.helpers import make_run, submit, wait_status

    settings = make_settings(f"sqlite:///{tmp_path / 'r.db'}", sim={"tokens_per_s": 20.0})
    first = Orchestrator(settings)
    await first.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=first))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=1000)).json()["step_id"]
        await wait_status(client, step_id, "running")
    # simulate a crash: the dispatcher's tasks vanish without writing their end
    if first.dispatcher._task is not None:
        first.dispatcher._task.cancel()
    for ex in list(first.dispatcher.executions.values()):
        assert ex.task is not None
        ex.task.cancel()
    await first.writer.stop()
    await first.db.dispose()

    second = Orchestrator(settings)
    await second.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=second))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            step = (await client.get(f"/v1/steps/{step_id}")).json()
            assert step["status"] == "failed"
            assert step["error"]["code"] == "INTERNAL"
            events = await read_stream(client, f"/v1/steps/{step_id}/stream")
            assert events[0].event == "started"
            assert events[-1].event == "error"
            assert [e.id for e in events] == [str(i) for i in range(len(events))]
    finally:
        await second.stop()


@pytest.mark.parametrize(
    "bad", ["pools: []", "pools:\n  - pool_id: a\n    engine: tpu\n    replicas: [{replica_id: r}]"]
)
def test_bad_pools_file_names_the_line(tmp_path: Path, bad: str) -> None:
    from orchestratord.pools.config import PoolConfigError, load_pools_file

    path = tmp_path / "pools.yaml"
    path.write_text(bad)
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    msg = str(info.value)
    assert str(path) in msg
    if "tpu" in bad:
        assert "pools.0.engine" in msg and "(line 3)" in msg
