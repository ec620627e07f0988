"""Write ``fixtures/divergent_run.json``: a recorded run whose second step diverges.

The run is recorded on the sim engine (the test settings: fast, no early eos) with the
engine perturbed at token 5 of the second step only, then exported. Strictly replaying it on
an honest sim engine must report exactly ``fixtures/divergent_report.json`` (see
``test_divergent_fixture.py``). Regenerate only when the bundle format or the sim engine
changes on purpose:

    .venv/bin/python -m tests.determinism.make_divergent_fixture
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import httpx

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from test_harness.perturbed import PerturbedAdapter
from tests.conftest import make_settings
from tests.helpers import wait_status

FIXTURES = Path(__file__).parent / "fixtures"
STEPS = [
    {"prompt": "Plan the first step.", "params": {"max_tokens": 10, "temperature": 0.7}},
    {"prompt": "Now the second step.", "params": {"max_tokens": 12, "temperature": 0.7}},
]
PERTURBED_STEP, PERTURBED_TOKEN = 1, 5


async def record() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        orch = Orchestrator(make_settings(f"sqlite:///{tmp}/fixture.db"))
        await orch.start()
        replica = orch.pools.pools["local"].replicas[0]
        honest = replica.adapter
        try:
            transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                flow = await client.post("/v1/flows", json={"ast": {"fixture": "divergent"}})
                run = await client.post(
                    f"/v1/flows/{flow.json()['flow_id']}/runs", json={"seed": 20261122}
                )
                run_id = run.json()["run_id"]
                for i, step_input in enumerate(STEPS):
                    replica.adapter = (
                        PerturbedAdapter(honest, at=PERTURBED_TOKEN)
                        if i == PERTURBED_STEP
                        else honest
                    )
                    r = await client.post(
                        f"/v1/runs/{run_id}/steps",
                        json={"type": "llm_call", "client_token": f"s{i}", "input": step_input},
                    )
                    await wait_status(client, r.json()["step_id"], "succeeded")
                bundle: dict[str, object] = (await client.get(f"/v1/runs/{run_id}/export")).json()
                return bundle
        finally:
            replica.adapter = honest
            await orch.stop()


def main() -> None:
    FIXTURES.mkdir(exist_ok=True)
    bundle = asyncio.run(record())
    path = FIXTURES / "divergent_run.json"
    path.write_text(json.dumps(bundle, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
