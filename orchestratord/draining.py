"""Graceful shutdown: the first SIGTERM (or SIGINT) drains the orchestrator, then stops.

Draining (``Orchestrator.drain``): no step is claimed any more, running steps get
``drain_s`` seconds to finish, the rest are let go (another process takes them over), and
every open stream ends so its client resumes elsewhere with ``Last-Event-ID``. Requests keep
being served meanwhile (a step submitted now is queued for the other processes). Then the
server stops listening and exits. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Any, *, drain_s: float) -> None:
        super().__init__(config)
        self.app = app  # its state holds the orchestrator once the lifespan has started
        self.drain_s = drain_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._draining is not None or not self.started:
            super().handle_exit(sig, frame)  # not serving yet, or a second signal: stop now
            return
        log.info("draining for up to %gs before shutdown", self.drain_s)
        self._draining = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        orch = getattr(self.app.state, "orchestrator", None)
        try:
            if orch is not None:
                await orch.drain(self.drain_s)
        except Exception:
            log.exception("drain failed; stopping")
        super().handle_exit(signal.SIGTERM, None)
