"""An interpreter's loop over orchestratord, written against the async SDK.

It plans with the model, calls the tools the plan suggests (each suggestion checked against
the tool's JSON Schema by the server; only valid ones are called), waits at a gate until a
fact it needs is appended, checkpoints its state, forks a second run from that checkpoint,
and completes both runs. Every write carries a client token, so a retried request never
does the work twice.

    python examples/agent_loop.py http://127.0.0.1:8080
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from contracts.common import Budgets
from contracts.events import EventBase, TokenEvent, ToolSuggestEvent
from contracts.flows import BuiltinExecutor, FlowCreate, Tool
from contracts.records import FactCreate
from contracts.runs import RunCreate
from orchestrator_client import AsyncClient, steps

ECHO = Tool(
    name="echo",
    description="say a text back",
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    executor=BuiltinExecutor(kind="builtin", name="echo"),
)
APPROVED = 'facts.exists(f, f.type == "approved")'


@dataclass
class Outcome:
    run_id: str
    fork_id: str
    plan_text: str
    tool_results: list[Any]
    gate_passed: bool
    checkpoint_id: str
    status: str
    fork_status: str


async def agent_loop(client: AsyncClient, *, seed: int = 7) -> Outcome:
    flow = await client.create_flow(FlowCreate(ast={"program": "agent-loop"}, tools=[ECHO]))
    run = await client.create_run(
        flow.flow_id, RunCreate(seed=seed, budgets=Budgets(max_tokens_out=4000))
    )

    # 1. plan: the model's text streams as tokens; each suggested call is a tool_suggest
    text: list[str] = []
    suggested: list[ToolSuggestEvent] = []

    def seen(event: EventBase) -> None:
        if isinstance(event, TokenEvent):
            text.append(event.t)
        elif isinstance(event, ToolSuggestEvent):
            suggested.append(event)

    prompt = "Greet the user by calling the echo tool with a friendly text."
    await client.run_step(
        run.run_id, steps.llm_plan(prompt, tools=["echo"], max_tokens=160), on_event=seen
    )

    # 2. tools: the valid suggestions, or the call the interpreter falls back to
    calls = [(s.tool, s.args) for s in suggested if s.valid and s.tool and isinstance(s.args, dict)]
    results = []
    for tool, args in calls or [("echo", {"text": "hello"})]:
        step = await client.run_step(run.run_id, steps.tool_call(tool, args))
        results.append((step.output or {}).get("result"))

    # 3. a gate that waits for a fact: it stays running until someone approves
    gate = await client.submit_step(run.run_id, steps.gate(APPROVED, wait_ms=60_000))
    await client.add_fact(run.run_id, FactCreate(type="approved", data={"by": "example"}))
    async for _ in client.stream_step(gate.step_id):
        pass
    gate_passed = ((await client.get_step(gate.step_id)).output or {}).get("result") is True

    # 4. checkpoint the interpreter's state, and fork a second run from it
    state = {"turn": 1, "tool_results": results}
    saved = await client.run_step(run.run_id, steps.checkpoint(state))
    checkpoint_id = str((saved.output or {})["checkpoint_id"])
    fork = await client.fork_run(run.run_id, checkpoint_id)
    await client.run_step(fork.run_id, steps.llm_call("And now, goodbye.", max_tokens=8))

    # 5. both runs end: the interpreter's last word
    done = await client.complete_run(run.run_id, "succeeded", output={"results": results})
    fork_done = await client.complete_run(fork.run_id, "succeeded")
    return Outcome(
        run_id=run.run_id,
        fork_id=fork.run_id,
        plan_text="".join(text),
        tool_results=results,
        gate_passed=gate_passed,
        checkpoint_id=checkpoint_id,
        status=done.status,
        fork_status=fork_done.status,
    )


async def main(url: str) -> None:
    async with AsyncClient(url) as client:
        outcome = await agent_loop(client)
    print(outcome)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
