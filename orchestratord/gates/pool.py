"""The evaluating processes: a few, started at the first gate and kept warm.

An evaluation takes a process (``workers`` of them, the rest wait their turn), sends it the
expression and its variables, and waits at most ``deadline_s`` for the value. Past the
deadline the process is killed; a process whose memory ran out (``memory_mb``) exits after
saying so; either way the next evaluation starts a fresh one. The server's own memory and
event loop never see the evaluation: what it builds lives and dies in the other process.
A warm process answers a gate over 5,000 small facts in ~30 ms (the runtime's conversion of
the facts dominates); starting one takes ~0.2 s, once.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import orjson

from orchestrator_core.gates import Gate, GateExprInvalid
from orchestratord.gates.facts import SharedReads
from orchestratord.settings import CelSettings

_WORKER = "orchestratord.gates.worker"
# what an evaluating process inherits of the environment: none of the server's settings
# (its pepper, database URL) reach a process that runs a client's expression
_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TMPDIR")
_CLOSE_WAIT_S = 2.0


class CelPool:
    def __init__(self, settings: CelSettings | None = None) -> None:
        self.settings = settings or CelSettings()
        self._idle: list[_Worker] = []
        self._turns = asyncio.Semaphore(self.settings.workers)
        self._ending: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.reads = SharedReads()  # what the gates of a run woken together read once
        self.evaluations = 0  # asked of a process, since the start (counted by tests)
        self.started = 0  # processes started

    async def evaluate(self, gate: Gate, payload: bytes) -> bool:
        """The gate's value over ``payload`` (``{"expr", "run", "facts"}`` as JSON), or
        ``GateExprInvalid`` naming the ``reason``: the expression's own failure, ``memory``,
        ``deadline`` or ``crashed``."""
        async with self._turns:
            worker = self._idle.pop() if self._idle else await self._start()
            self.evaluations += 1
            reply: dict[str, Any] = {}
            try:
                reply = await worker.ask(payload, self.settings.deadline_s)
            except TimeoutError:
                raise self._past_deadline(gate) from None
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise _crashed(gate, worker.proc.returncode) from exc
            finally:
                if ("value" in reply or "error" in reply) and not self._closed:
                    self._idle.append(worker)
                else:  # spent, late, gone, or this evaluation was cancelled
                    self._end(worker)
        return self._value(gate, reply)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(w.close() for w in idle), *self._ending)

    async def _start(self) -> _Worker:
        self.started += 1
        env = {k: os.environ[k] for k in _ENVIRONMENT if k in os.environ}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            _WORKER,
            str(self.settings.memory_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return _Worker(proc)

    def _end(self, worker: _Worker) -> None:
        task = asyncio.ensure_future(worker.kill())
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    def _value(self, gate: Gate, reply: dict[str, Any]) -> bool:
        if "value" in reply:
            return bool(reply["value"])
        if "error" in reply:
            error = reply["error"]
            raise GateExprInvalid(error["message"], details={"expr": gate.expr, **error["details"]})
        limit = self.settings.memory_mb
        raise GateExprInvalid(
            f"the expression's evaluation passed its memory limit ({limit} MiB)",
            details={"expr": gate.expr, "reason": "memory", "limit_mb": limit},
        )

    def _past_deadline(self, gate: Gate) -> GateExprInvalid:
        limit = self.settings.deadline_s
        return GateExprInvalid(
            f"the expression's evaluation ran past its deadline ({limit:g} s)",
            details={"expr": gate.expr, "reason": "deadline", "limit_s": limit},
        )


def _crashed(gate: Gate, returncode: int | None) -> GateExprInvalid:
    return GateExprInvalid(
        f"the process evaluating the expression ended without an answer ({returncode})",
        details={"expr": gate.expr, "reason": "crashed", "returncode": returncode},
    )


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, payload: bytes, deadline_s: float) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        async with asyncio.timeout(deadline_s):
            stdin.write(len(payload).to_bytes(4, "big") + payload)
            await stdin.drain()
            head = await stdout.readexactly(4)
            reply: dict[str, Any] = orjson.loads(
                await stdout.readexactly(int.from_bytes(head, "big"))
            )
        return reply

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()

    async def close(self) -> None:
        """Ask it to end (its stdin closes); killed if it does not within a while."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await self.proc.wait()
        except TimeoutError:
            await self.kill()
