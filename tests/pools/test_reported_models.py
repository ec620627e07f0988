"""A replica serves every model its engine lists: a step naming one of them is placed there,
one naming a model no engine lists is refused naming ``input.model``."""

from __future__ import annotations

from pathlib import Path

from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, started_client, wait_status


async def test_a_step_naming_a_model_the_engine_lists_is_placed_on_it(
    db_url: str, tmp_path: Path
) -> None:
    state = FakeState(also_serves=("lora-a",))
    async with serve_app(create_fake_openai(state)) as url:
        pools = tmp_path / "pools.yaml"
        pools.write_text(
            "pools:\n"
            "  - pool_id: remote\n    engine: openai\n"
            f"    replicas: [{{replica_id: r0, url: '{url}/v1', model: fake-model}}]\n"
            "  - pool_id: local\n    engine: sim\n    replicas: [{replica_id: r0}]\n"
        )
        orch = Orchestrator(make_settings(db_url, pools_file=pools, price_table=None))
        async with started_client(orch) as client:
            shown = (await client.get("/v1/pools/remote")).json()
            assert shown["capabilities"]["models"] == ["fake-model", "lora-a"]
            run_id = await make_run(client)

            async def step(model: str, token: str) -> tuple[int, dict[str, object]]:
                body = {
                    "type": "llm_call",
                    "client_token": token,
                    "input": {"model": model, "prompt": "x", "params": {"max_tokens": 2}},
                }
                r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
                return r.status_code, r.json()

            code, body = await step("lora-a", "a")
            assert code == 202, body
            ended = await wait_status(client, str(body["step_id"]), "succeeded", "failed")
            assert ended["pool_id"] == "remote"
            assert state.requests[-1]["model"] == "lora-a"  # the engine is asked for it
            code, body = await step("unlisted-9b", "b")
            assert code == 422, body
            assert "input.model" in str(body)
