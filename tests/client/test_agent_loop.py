"""examples/agent_loop.py, an interpreter's loop written against the async SDK, runs to its
end against a real server: a plan, the tool calls, a gate that waits for a fact, a
checkpoint, a fork from it, and both runs completed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from examples.agent_loop import APPROVED, agent_loop
from orchestrator_client import AsyncClient

ROOT = Path(__file__).resolve().parents[2]


async def test_the_agent_loop_runs_to_its_end(server_url: str) -> None:
    async with AsyncClient(server_url) as client:
        outcome = await agent_loop(client)
        assert (outcome.status, outcome.fork_status) == ("succeeded", "succeeded")
        assert outcome.plan_text and outcome.gate_passed
        assert outcome.tool_results and all(isinstance(r, dict) for r in outcome.tool_results)
        kinds = [s.type for s in await client.list_steps(outcome.run_id)]
        assert kinds[0] == "llm_plan" and kinds[-2:] == ["gate_eval", "checkpoint"]
        assert set(kinds[1:-2]) == {"tool_call"}
        facts = [f.type for f in await client.list_facts(outcome.run_id)]
        assert "approved" in facts and "gate_result" in facts
        fork = await client.get_run(outcome.fork_id)
        assert fork.forked_from == {
            "run_id": outcome.run_id,
            "checkpoint_id": outcome.checkpoint_id,
        }
        copied = [f.type for f in await client.list_facts(outcome.fork_id)]
        assert "approved" in copied  # the fork holds the facts up to its checkpoint
        gate = (await client.list_steps(outcome.run_id))[-2]
        assert gate.input["expr"] == APPROVED


async def test_the_example_runs_as_a_program(server_url: str) -> None:
    program = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "agent_loop.py"),
        server_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    out, err = await asyncio.wait_for(program.communicate(), 120)
    assert program.returncode == 0, err.decode()
    assert "status='succeeded'" in out.decode()
