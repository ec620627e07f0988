"""Where costly checks of client input run: a worker thread, outside the write transaction.

A value checked against a client's schema (tool args, fact data, a flow's schemas) is cheap
most of the time and is checked where it is asked, on the event loop. A costly one raises
``ValidationDeferred`` there (``orchestrator_core.schemas.bounds``); :meth:`Validation.
offloading` catches it, runs the check on a worker thread under the deadline, and asks the
operation again with the check's result in hand. The operation's transaction is given up
before the check runs: a SQLite write lock is not held while a schema is being checked.

A thread, not a process, measured: pure-Python validation for 5 s on a thread kept a
``/healthz`` poller's p99 at 57 ms (62 ms max), against 4.9 s with the check on the loop; a
process pool did 9 ms, but costs a process per worker, a pickled copy of each value and its
schema both ways, and compiling every validator once per process. The thread cannot be
interrupted: the validator looks at the deadline as it goes (``schemas.validator``), and
RE2, which matches without the GIL, is only started on text it can finish within it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from orchestrator_core.schemas.bounds import Done, ValidationBound, ValidationDeferred, configure
from orchestrator_core.schemas.bounds import deferring as _deferring

T = TypeVar("T")

# Checks one operation may defer (each value checked is one: a step or a fact has one, a
# flow one for all its schemas); past it something asks again and again: a fault
_MAX_DEFERRALS = 16


class Validation:
    """The worker threads and the bound they check under (settings ``validation.*``)."""

    def __init__(self, bound: ValidationBound, *, workers: int = 1) -> None:
        self.bound = bound
        configure(bound)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="validation")

    async def offloading(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()``, its costly checks run on a worker thread (see the module)."""
        done: list[Done] = []
        while len(done) <= _MAX_DEFERRALS:
            try:
                with _deferring(tuple(done)):
                    return await operation()
            except ValidationDeferred as deferred:
                result = await self.run(deferred.run)
                done.append((deferred.key, deferred.instance, result))
        raise RuntimeError(f"an operation deferred more than {_MAX_DEFERRALS} checks")

    async def run(self, check: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, check)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
