"""A served app keeps what its startup built out of the collector's full passes
(``api/app.py:freeze_startup_heap``): a full collection of a serving process took 80 ms,
added to whichever request it landed on."""

from __future__ import annotations

import gc
from pathlib import Path

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings


async def test_the_startup_heap_is_frozen_while_the_app_serves(tmp_path: Path) -> None:
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'a.db'}"))
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        async with app.router.lifespan_context(app):
            frozen = gc.get_freeze_count()
            # the modules, the models, the orchestrator: tens of thousands of objects
            assert frozen > 10_000, frozen
            assert app.state.orchestrator is not None
    finally:
        gc.unfreeze()


async def test_an_app_around_a_given_orchestrator_leaves_the_heap_alone(
    orch: Orchestrator,
) -> None:
    app = create_app(orchestrator=orch)
    gc.unfreeze()
    async with app.router.lifespan_context(app):
        assert gc.get_freeze_count() == 0
