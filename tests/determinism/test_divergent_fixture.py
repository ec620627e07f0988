"""A recorded divergent run, kept as a fixture, proves the strict_replay report.

``fixtures/divergent_run.json`` was recorded with the engine perturbed at token 5 of its
second step (``make_divergent_fixture.py``). Imported and strictly replayed on the honest
engine, it must give exactly ``fixtures/divergent_report.json``: step 0 identical, step 1
diverged at token 5 with the recorded (perturbed) token expected, the engine's actual one,
and the tokens around it. Replay ids are new on every run, so they are compared as
placeholders. ``ORCHESTRATORD_REGENERATE_FIXTURES=1`` rewrites the expected report after a
deliberate change (review the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import read_stream, wait_status

FIXTURES = Path(__file__).parent / "fixtures"


def _load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _placeholders(report: dict[str, Any], replay_steps: list[str]) -> dict[str, Any]:
    text = json.dumps(report)
    for i, step_id in enumerate(replay_steps):
        text = text.replace(step_id, f"<replay step {i}>")
    return {**json.loads(text), "run_id": "<replay run>"}


async def test_strict_replay_of_the_divergent_fixture_reports_exactly(
    live: httpx.AsyncClient,
) -> None:
    bundle = _load("divergent_run.json")
    imported = await live.post("/v1/runs:import", json=bundle)
    assert imported.status_code == 201, imported.text
    source = bundle["run"]["run_id"]
    strict = await live.post(
        f"/v1/flows/{bundle['flow']['flow_id']}/runs",
        json={"mode": "strict_replay", "source_run_id": source},
    )
    assert strict.status_code == 201, strict.text
    run_id = strict.json()["run_id"]
    replay_steps = []
    for step in sorted(bundle["steps"], key=lambda s: s["position"]):
        r = await live.post(
            f"/v1/runs/{run_id}/steps",
            json={
                "type": step["type"],
                "client_token": step["client_token"],
                "input": step["input"],
            },
        )
        assert r.status_code == 202, r.text
        replay_steps.append(r.json()["step_id"])
        await wait_status(live, replay_steps[-1], "succeeded", "failed")
    report = (await live.get(f"/v1/runs/{run_id}/replay-report")).json()
    if os.environ.get("ORCHESTRATORD_REGENERATE_FIXTURES") == "1":
        (FIXTURES / "divergent_report.json").write_text(
            json.dumps(_placeholders(report, replay_steps), indent=1, ensure_ascii=False) + "\n"
        )
    assert _placeholders(report, replay_steps) == _load("divergent_report.json")
    # the stream of the diverged step: the agreeing prefix, then the error with the report
    events = await read_stream(live, f"/v1/steps/{replay_steps[1]}/stream")
    assert [e.event for e in events] == ["started", "narration"] + ["token"] * 5 + ["error"]
    assert (
        events[-1].data
        and events[-1].data["details"]["divergence"] == (report["steps"][1]["divergence"])
    )
