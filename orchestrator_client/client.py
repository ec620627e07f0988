"""The clients: :class:`AsyncClient` for an async interpreter, :class:`Client` for scripts.

Both have every route of :class:`~orchestrator_client.routes.Routes` (the async one's
methods are coroutines), typed streams that resume across drops, retries of what the server
marks retriable, and :meth:`run_step`: submit a step, follow it to its end, and answer its
record, the loop an interpreter repeats (plan, tool call, gate, checkpoint).

    async with AsyncClient("http://127.0.0.1:8080") as client:
        flow = await client.create_flow({"ast": {"program": "hello"}})
        run = await client.create_run(flow.flow_id, {"seed": 7})
        step = await client.run_step(run.run_id, steps.llm_call("Say hi."))
        print(step.output)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from contracts.events import EndEvent, ErrorEvent, EventBase
from contracts.records import FactOut
from contracts.runs import RunOut
from contracts.steps import AnyStepCreate, StepOut
from orchestrator_client.errors import StepFailed, Unreachable
from orchestrator_client.routes import Routes, step_body
from orchestrator_client.transport import AsyncTransport, SyncTransport

OnEvent = Callable[[EventBase], None]


def _ended(step_id: str, last: EventBase | None) -> None:
    if isinstance(last, ErrorEvent):
        raise StepFailed(step_id, last.model_dump(mode="json"))
    if not isinstance(last, EndEvent):
        raise Unreachable(f"the stream of {step_id} closed without an end or error event")


class Client(Routes, SyncTransport):
    """A blocking client of one orchestratord server: ``Client(base_url, *, api_key,
    timeout, retry, stream_give_up_s, transport, user_agent)`` (see ``transport._Settings``).
    Use it as ``with Client(...) as client``."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_step(
        self,
        run_id: str,
        step: AnyStepCreate | Mapping[str, Any],
        *,
        on_event: OnEvent | None = None,
    ) -> StepOut:
        """Submit ``step``, follow its stream to the end (``on_event`` sees each event) and
        answer its record. A step that ends in ``error`` raises :class:`StepFailed`."""
        accepted = self.submit_step(run_id, step_body(step))
        last: EventBase | None = None
        for event in self.stream_step(accepted.step_id):
            last = event
            if on_event is not None:
                on_event(event)
        _ended(accepted.step_id, last)
        return self.get_step(accepted.step_id)

    def iter_runs(
        self, *, flow_id: str | None = None, status: str | None = None, page: int = 100
    ) -> Iterator[RunOut]:
        """Every run (of ``flow_id``, in ``status``), newest first, ``page`` a request."""
        after: str | None = None
        while True:
            got = self.list_runs(flow_id=flow_id, status=status, after=after, limit=page)
            yield from got
            if len(got) < page:
                return
            after = got[-1].run_id

    def iter_facts(
        self, run_id: str, *, type: str | None = None, page: int = 100
    ) -> Iterator[FactOut]:
        """Every fact of the run (of ``type``), in append order, ``page`` a request."""
        after: str | None = None
        while True:
            got = self.list_facts(run_id, type=type, after=after, limit=page)
            yield from got
            if len(got) < page:
                return
            after = got[-1].fact_id


class AsyncClient(Routes, AsyncTransport):
    """The async client: the same routes as :class:`Client`, as coroutines, and streams as
    async iterators. Use it as ``async with AsyncClient(...) as client``."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run_step(
        self,
        run_id: str,
        step: AnyStepCreate | Mapping[str, Any],
        *,
        on_event: OnEvent | None = None,
    ) -> StepOut:
        """Submit ``step``, follow its stream to the end (``on_event`` sees each event) and
        answer its record. A step that ends in ``error`` raises :class:`StepFailed`."""
        accepted = await self.submit_step(run_id, step_body(step))
        last: EventBase | None = None
        async for event in self.stream_step(accepted.step_id):
            last = event
            if on_event is not None:
                on_event(event)
        _ended(accepted.step_id, last)
        return await self.get_step(accepted.step_id)

    async def iter_runs(
        self, *, flow_id: str | None = None, status: str | None = None, page: int = 100
    ) -> AsyncIterator[RunOut]:
        """Every run (of ``flow_id``, in ``status``), newest first, ``page`` a request."""
        after: str | None = None
        while True:
            got = await self.list_runs(flow_id=flow_id, status=status, after=after, limit=page)
            for run in got:
                yield run
            if len(got) < page:
                return
            after = got[-1].run_id

    async def iter_facts(
        self, run_id: str, *, type: str | None = None, page: int = 100
    ) -> AsyncIterator[FactOut]:
        """Every fact of the run (of ``type``), in append order, ``page`` a request."""
        after: str | None = None
        while True:
            got = await self.list_facts(run_id, type=type, after=after, limit=page)
            for fact in got:
                yield fact
            if len(got) < page:
                return
            after = got[-1].fact_id
